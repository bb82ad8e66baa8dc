// The process tests/io/crash_test.sh kills: saves checkpoints of a model (tests/io/model.hpp
// plus an 8 MiB tensor, so that a save takes a while), step after step, until killed; and
// checks afterwards that the checkpoint left behind loads, checksums and all, and holds the
// values of one complete step.
//
// With `fail` (tests/io/full_disk_test.sh), ranks 0 and n-1 limit the size of the files
// they write; the save of step 2 must raise io_error on every rank, and the checkpoint of step 1
// must still load.
//
// With `lie` (the same script), the last rank's disk loses a write it reports as done: the
// first large write into the checkpoint's folder returns success and writes nothing (what
// Open MPI's collective write does on a full disk; a file system can do the same).
// The save of step 2 must find that out before it replaces step 1, and raise on every rank.
//
//   crash_writer once|loop|verify|fail|lie PATH integrated|per_rank
#include <xshard/comm/environment.hpp>
#include <xshard/io/checkpoint.hpp>

#include "model.hpp"

#include <dlfcn.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <tuple>

using namespace xshard::testing;

namespace {

// The lying disk: armed with the folder whose files lose their first large write.
std::string lie_under;
bool lied = false;

using pwritev_fn = ssize_t (*)(int, const ::iovec*, int, off_t);

ssize_t maybe_lie(pwritev_fn real, int fd, const ::iovec* iov, int count, off_t offset) {
    std::size_t bytes = 0;
    for (int i = 0; i < count; ++i)
        bytes += iov[i].iov_len;
    if (!lie_under.empty() && !lied && bytes >= (std::size_t(64) << 10)) {
        char target[PATH_MAX] = {};
        const auto n =
            ::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), target, sizeof target - 1);
        if (n > 0 && std::string(target, std::size_t(n)).starts_with(lie_under + "/")) {
            lied = true;
            return ssize_t(bytes);
        }
    }
    return real(fd, iov, count, offset);
}

} // namespace

// These take the place of the C library's in this program (every write of xshard's
// checkpoints is a pwritev); unarmed they pass every call on.
extern "C" ssize_t pwritev(int fd, const ::iovec* iov, int count, off_t offset) {
    static const auto real = reinterpret_cast<pwritev_fn>(::dlsym(RTLD_NEXT, "pwritev"));
    return maybe_lie(real, fd, iov, count, offset);
}
extern "C" ssize_t pwritev64(int fd, const ::iovec* iov, int count, off_t offset) {
    static const auto real = reinterpret_cast<pwritev_fn>(::dlsym(RTLD_NEXT, "pwritev64"));
    return maybe_lie(real, fd, iov, count, offset);
}

namespace {

struct model {
    net small;
    dyn<double, 2> big;

    explicit model(const ckpt_mesh& m)
        : small(m, saved_layouts)
        , big(xshard::zeros<double, xshard::dynamic_layout(2)>(m, {1024, 1024}, "[-, mp]")) {}

    friend void visit_parameters(model& n, auto&& visit) {
        visit("small", n.small);
        visit("big", n.big);
    }
};

} // namespace

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    if (argc != 4) {
        std::fprintf(stderr,
                     "usage: crash_writer once|loop|verify|fail|lie PATH integrated|per_rank\n");
        return 2;
    }
    const std::string mode = argv[1], path = argv[2], format = argv[3];
    const auto w = xshard::communicator::world();
    const ckpt_mesh mesh(w, {1, w.size()});
    model m(mesh);
    if (mode == "verify") {
        const auto info = xshard::load_checkpoint(path, m); // throws if damaged
        const auto bad =
            m.small.mismatches_all(info.step, false) + mismatches(m.big, "big", info.step);
        if (mesh.rank() == 0)
            std::printf("loaded step %lld: %s\n", static_cast<long long>(info.step),
                        bad ? "WRONG VALUES" : "ok");
        return bad || info.step < 1 ? 1 : 0;
    }
    const xshard::checkpoint_options options{.format = format == "integrated"
                                                           ? xshard::checkpoint_format::integrated
                                                           : xshard::checkpoint_format::per_rank};
    if (mode == "fail" || mode == "lie") {
        if (mode == "lie" && mesh.rank() == w.size() - 1) {
            lie_under = std::filesystem::absolute(path).parent_path().string();
        } else if (mode == "fail") {
            // On rank 0 and the last rank (a per-rank file of 8/n MiB), files of at most 1
            // MiB, set after MPI's own start-up; a write past the limit fails with EFBIG, as
            // on a full disk, instead of killing the process.
            std::signal(SIGXFSZ, SIG_IGN);
            if (mesh.rank() == 0 || mesh.rank() == w.size() - 1) {
                const rlimit limit{std::size_t(1) << 20, std::size_t(1) << 20};
                if (::setrlimit(RLIMIT_FSIZE, &limit) != 0)
                    return 3;
            }
        }
        m.small.fill_all(2);
        fill(m.big, "big", 2);
        auto o = options;
        o.step = 2;
        bool raised = false;
        try {
            xshard::save_checkpoint(path, m, o);
        } catch (const xshard::io_error& e) {
            raised = true;
            std::printf("rank %d: the save raised: %s\n", mesh.rank(), e.what());
        }
        lie_under.clear();
        if (mode == "lie" && mesh.rank() == w.size() - 1 && !lied) {
            std::printf("rank %d: no write was lost: the test tests nothing\n", mesh.rank());
            return 1;
        }
        const auto info = xshard::load_checkpoint(path, m);
        const auto bad = m.small.mismatches_all(1, false) + mismatches(m.big, "big", 1);
        std::printf("rank %d: loaded step %lld: %s\n", mesh.rank(),
                    static_cast<long long>(info.step), bad ? "WRONG VALUES" : "ok");
        return raised && info.step == 1 && !bad ? 0 : 1;
    }
    for (std::int64_t step = 1; mode == "loop" || step == 1; ++step) {
        m.small.fill_all(step);
        fill(m.big, "big", step);
        auto o = options;
        o.step = step;
        xshard::save_checkpoint(path, m, o);
    }
}
