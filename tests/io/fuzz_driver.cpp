// A driver for fuzz_safetensors.cpp that needs no libFuzzer, so that every build runs the
// fuzz target (clang's libFuzzer, coverage-guided, runs it too where clang is installed:
// io.libfuzzer). It runs each seed as it is, then random mutations of the seeds for a
// bounded time: bit flips, bytes that matter to JSON and to the formats' numbers, ranges
// erased, repeated or moved, truncations, and digit runs replaced by numbers at the edges of
// the integer types. The mutations come from a seeded generator, so a failure can be
// replayed; the input that failed is also written to `failed-input` in the working
// directory. Any bytes must give a result or an xshard error: a crash, a trap or an
// exception of another kind fails the run (and, under the sanitizers, any memory error), and
// so does an allocation past 1 GiB of heap (RLIMIT_DATA, outside AddressSanitizer, whose own
// limit is its allocator's): std::bad_alloc is not an xshard error.
//
//   fuzz_driver SECONDS SEED_FILE... [--seed N]
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

using namespace std::literals;

namespace {

// The input being run, for the signal handler that saves it.
const std::string* current = nullptr;

void save_and_die(int sig) {
    if (current) {
        const int fd = ::open("failed-input", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            [[maybe_unused]] const auto n = ::write(fd, current->data(), current->size());
            ::close(fd);
        }
    }
    std::signal(sig, SIG_DFL);
    std::raise(sig);
}

void run(const std::string& input) {
    current = &input;
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
    current = nullptr;
}

/// One random change to `s`.
void mutate(std::string& s, std::mt19937_64& rng, const std::vector<std::string>& seeds) {
    const auto below = [&](std::size_t n) {
        return n == 0 ? 0 : std::size_t(rng() % n);
    };
    static constexpr std::string_view special = "0123456789[]{}\",:-.eE +\\\0\xff\x7f\x80"sv;
    static const std::string_view numbers[] = {"0",
                                               "-1",
                                               "1",
                                               "7",
                                               "65536",
                                               "2147483647",
                                               "2147483648",
                                               "4294967295",
                                               "4294967297",
                                               "9223372036854775807",
                                               "9223372036854775808",
                                               "18446744073709551615",
                                               "18446744073709551616",
                                               "4611686018427387904",
                                               "2.7",
                                               "1e300",
                                               "-0",
                                               "1.0"};
    switch (s.empty() ? 4 : rng() % 9) {
    case 0: // a bit
        s[below(s.size())] ^= char(1u << (rng() % 8));
        break;
    case 1: // a byte that means something to the formats
        s[below(s.size())] = special[below(special.size())];
        break;
    case 2: // a range erased
        s.erase(below(s.size()), 1 + below(16));
        break;
    case 3: { // a range repeated elsewhere
        const auto from = below(s.size()),
                   n = 1 + below(std::min<std::size_t>(64, s.size() - from));
        s.insert(below(s.size() + 1), s.substr(from, n));
        break;
    }
    case 4: // random bytes
        s.insert(below(s.size() + 1), std::string(1 + below(8), char(rng())));
        break;
    case 5: // truncated
        s.resize(below(s.size() + 1));
        break;
    case 6: { // a run of digits replaced by a number at an edge
        auto at = s.find_first_of("0123456789", below(s.size()));
        if (at == std::string::npos)
            at = s.find_first_of("0123456789");
        if (at == std::string::npos)
            break;
        auto end = s.find_first_not_of("0123456789", at);
        s.replace(at, (end == std::string::npos ? s.size() : end) - at,
                  numbers[below(std::size(numbers))]);
        break;
    }
    case 7: { // a piece of another seed spliced in
        const auto& other = seeds[below(seeds.size())];
        const auto from = below(other.size());
        s.insert(below(s.size() + 1), other.substr(from, 1 + below(256)));
        break;
    }
    default: // what the first byte selects (fuzz_safetensors.cpp)
        s[0] = char(rng() % 5);
        break;
    }
}

} // namespace

int main(int argc, char** argv) {
    std::vector<std::string> seeds;
    double seconds = 0;
    std::uint64_t seed = 1;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--seed" && i + 1 < argc)
            seed = std::strtoull(argv[++i], nullptr, 10);
        else if (i == 1)
            seconds = std::atof(argv[i]);
        else {
            std::ifstream in(a, std::ios::binary);
            if (!in) {
                std::fprintf(stderr, "fuzz_driver: cannot read %s\n", a.c_str());
                return 2;
            }
            seeds.emplace_back(std::istreambuf_iterator<char>(in),
                               std::istreambuf_iterator<char>());
        }
    }
    if (seconds <= 0 || seeds.empty()) {
        std::fprintf(stderr, "usage: fuzz_driver SECONDS SEED_FILE... [--seed N]\n");
        return 2;
    }
#ifndef __SANITIZE_ADDRESS__
    const rlimit heap{std::size_t(1) << 30, std::size_t(1) << 30};
    if (::setrlimit(RLIMIT_DATA, &heap) != 0) {
        std::perror("fuzz_driver: setrlimit");
        return 2;
    }
#endif
    for (const int sig : {SIGABRT, SIGSEGV, SIGILL, SIGBUS, SIGFPE, SIGTRAP})
        std::signal(sig, save_and_die);
    for (const auto& s : seeds)
        run(s);
    std::mt19937_64 rng(seed);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    std::size_t inputs = seeds.size();
    std::string input;
    while (std::chrono::steady_clock::now() < until) {
        input = seeds[rng() % seeds.size()];
        for (auto n = 1 + rng() % 8; n > 0; --n)
            mutate(input, rng, seeds);
        run(input);
        ++inputs;
    }
    std::printf("fuzz_driver: %zu inputs from %zu seeds in %.0f s (--seed %llu), no failure\n",
                inputs, seeds.size(), seconds, static_cast<unsigned long long>(seed));
    return 0;
}
