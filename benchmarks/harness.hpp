#pragma once
// The benchmark harness: alternating timed repetitions of a candidate and its baseline,
// medians, and one JSON line per case on stdout (rank 0). Anything else goes to stderr.
//
// A repetition starts with a barrier and its time is the slowest rank's. Run a program
// with --reps N to change the repetitions (default 7, at least 5 are printed as valid),
// --filter S to run only cases whose name contains S (S ending in '$': whose name ends in
// the rest of S, so `--filter mlp_step_dp2_f64$` runs that case alone), and --quick for a
// smoke run with small sizes (used by ctest to check that the program works; figures from
// it mean nothing).

#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xshard::bench {

struct options {
    int reps = 7;
    bool quick = false;
    /// Programs' cases also print their step node by node (stderr, rank 0).
    bool profile = false;
    std::string filter;

    static options parse(int argc, char** argv) {
        options o;
        for (int i = 1; i < argc; ++i) {
            const std::string_view arg = argv[i];
            if (arg == "--quick")
                o.quick = true;
            else if (arg == "--reps" && i + 1 < argc)
                o.reps = std::max(1, std::atoi(argv[++i]));
            else if (arg == "--profile")
                o.profile = true;
            else if (arg == "--filter" && i + 1 < argc)
                o.filter = argv[++i];
            else {
                std::fprintf(stderr, "usage: %s [--reps N] [--filter S] [--quick] [--profile]\n",
                             argv[0]);
                std::exit(2);
            }
        }
        if (o.quick)
            o.reps = 1;
        return o;
    }

    bool wants(std::string_view name) const {
        if (!filter.empty() && filter.back() == '$')
            return name.ends_with(std::string_view(filter).substr(0, filter.size() - 1));
        return filter.empty() || name.find(filter) != std::string_view::npos;
    }
};

inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const auto n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Seconds per call of `f` over a batch of `calls` calls, on the slowest rank, after a
/// barrier.
template <class F>
double time_batch(const communicator& c, F&& f, int calls) {
    barrier(c);
    const double start = MPI_Wtime();
    for (int i = 0; i < calls; ++i)
        f();
    double elapsed = (MPI_Wtime() - start) / calls;
    allreduce(c, std::span(&elapsed, 1), reduction::max);
    return elapsed;
}

/// This process's resident set and its peak (VmRSS, VmHWM of /proc/self/status), in bytes.
inline std::pair<std::size_t, std::size_t> resident_bytes() {
    std::FILE* f = std::fopen("/proc/self/status", "r");
    std::size_t rss = 0, hwm = 0;
    if (!f)
        return {0, 0};
    char line[256];
    while (std::fgets(line, sizeof line, f)) {
        unsigned long kb = 0;
        if (std::sscanf(line, "VmRSS: %lu kB", &kb) == 1)
            rss = kb * 1024;
        else if (std::sscanf(line, "VmHWM: %lu kB", &kb) == 1)
            hwm = kb * 1024;
    }
    std::fclose(f);
    return {rss, hwm};
}

/// Resets VmHWM to the current resident set (Linux: "5" into /proc/self/clear_refs).
inline void reset_peak() {
    if (std::FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
        std::fputs("5", f);
        std::fclose(f);
    }
}

struct comparison {
    double seconds;
    double baseline_seconds;
};

/// Times `candidate` and `baseline` alternately, so that drifting load on a shared
/// machine affects both alike. A warm-up call of each comes first; calls shorter than a
/// millisecond are timed in batches long enough for the clock and the barrier not to
/// matter, and a repetition's figure is the batch time per call.
template <class F, class G>
comparison compare(const communicator& c, const options& o, F&& candidate, G&& baseline) {
    const double warm = std::max(time_batch(c, candidate, 1), time_batch(c, baseline, 1));
    const int calls = o.quick ? 1 : int(std::clamp(2e-3 / std::max(warm, 1e-9), 1.0, 1000.0));
    std::vector<double> a, b;
    for (int r = 0; r < o.reps; ++r) {
        a.push_back(time_batch(c, candidate, calls));
        b.push_back(time_batch(c, baseline, calls));
    }
    return {median(a), median(b)};
}

/// Prints the JSON line of a case (rank 0 of `c` only).
/// `extra`: further JSON fields of the case ("\"halo_bytes\": 123"), appended as they are.
inline void report(const communicator& c, std::string_view name, std::size_t bytes,
                   std::string_view baseline, comparison t, std::string_view extra = {}) {
    if (c.rank() != 0)
        return;
    std::printf("{\"name\": \"%.*s\", \"ranks\": %d, \"bytes\": %zu, \"seconds\": %.6g, "
                "\"baseline\": \"%.*s\", \"baseline_seconds\": %.6g, \"ratio\": %.4f%s%.*s}\n",
                int(name.size()), name.data(), c.size(), bytes, t.seconds, int(baseline.size()),
                baseline.data(), t.baseline_seconds, t.seconds / t.baseline_seconds,
                extra.empty() ? "" : ", ", int(extra.size()), extra.empty() ? "" : extra.data());
    std::fflush(stdout);
}

} // namespace xshard::bench
