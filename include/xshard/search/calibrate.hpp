#pragma once
/// \file
/// The machine figures the strategy search prices with, measured on the ranks that will run:
/// one rank's GEMM speed (`machine_model::gemm_flops`, and `gemm_half_dimension`: how it falls
/// on narrow shapes), the memory bandwidth of its elementwise work (`memory_bandwidth`), the
/// cost of its transcendental functions (`transcendental_seconds`) and the alpha-beta links of
/// the redistribution steps (`links`, `calibrate_links`). Every rank measures at the same
/// time, since ranks of a node share its memory bandwidth when they train, and the slowest
/// rank's figures are kept, the same on every rank.
///
///     auto machine = xshard::measure_machine<double>(mesh.comm());
///     net.set_machine_model(machine); // auto_parallel: what its engines price with
///
/// The defaults of machine_model are guesses; a machine's measured figures can differ from
/// them several times over, and so would every predicted step time (benchmarks/README.md,
/// "Strategy search", gives figures). The links are fitted over all the communicator's ranks
/// at once; links of their own for some mesh axes (`cost_model::axis_links`, say an axis
/// across nodes) stay as given.
///
/// What two GEMMs and one update do not show (a kernel's own efficiency on its shapes, the
/// ranks' contention for a node's memory), a profiled step of the program shows:
/// `calibrate_ops` fits a factor per primitive from it, for the search to price with.
///
///     net.profile_steps();                 // a compiled program (graph/profile.hpp)
///     for (int i = 0; i < 5; ++i) train_step(net);
///     machine = xshard::calibrate_ops(mesh.comm(), machine, net.profile(), found);
///     found = xshard::search_program(traced, mesh.shape(), {.machine = machine});

#include <xshard/compiled.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/graph/profile.hpp>
#include <xshard/ops/matmul.hpp>
#include <xshard/optim/optimizers.hpp>
#include <xshard/redistribute/redistribute.hpp>
#include <xshard/search/machine_model.hpp>
#include <xshard/search/program_search.hpp>
#include <xshard/tensor/distribute.hpp>

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace xshard {

namespace detail {

/// The median of `v` (its upper middle element when even), non-empty.
inline double median(std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
    return v[v.size() / 2];
}

/// Seconds of a typical call of `f`: the median of `repeats` calls after an untimed one (the
/// first call faults the pages in and sets the library's buffers up). The median, not the
/// fastest, since the search predicts a typical step: on a machine that other work shares,
/// the fastest call sees an idle machine that the steps do not.
template <class F>
double typical_of(int repeats, F&& f) {
    f();
    std::vector<double> times;
    for (int r = 0; r < std::max(repeats, 1); ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        times.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return median(std::move(times));
}

} // namespace detail

/// FLOP/s of this rank's GEMM of T: a typical one of `repeats` [rows, in] x [in, out] products
/// (`detail::typical_of`). No communication.
template <class T>
double measure_gemm_flops(std::size_t rows, std::size_t in, std::size_t out, int repeats = 5) {
    std::vector<T> a(rows * in), b(in * out), c(rows * out);
    for (std::size_t i = 0; i < a.size(); ++i)
        a[i] = T(double(i % 17) / 17 - 0.5);
    for (std::size_t i = 0; i < b.size(); ++i)
        b[i] = T(double(i % 13) / 13 - 0.5);
    const double s = detail::typical_of(repeats, [&] {
        detail::gemm(false, false, rows, out, in, a.data(), in, b.data(), out, false, c.data(),
                     out);
    });
    return 2.0 * double(rows) * double(in) * double(out) / std::max(s, 1e-9);
}

/// Seconds per element of one transcendental function as the elementwise kernels run them, in
/// xsimd's vectors of T: erf and exp over `n` elements (a block the cache holds), a typical
/// one of `repeats` passes (`detail::typical_of`). No communication.
template <class T>
double measure_transcendental_seconds(std::size_t n, int repeats = 5) {
    using batch = xsimd::batch<T>;
    constexpr std::size_t lanes = batch::size;
    n = std::max(n / lanes, std::size_t(1)) * lanes;
    std::vector<T> x(n), y(n);
    for (std::size_t i = 0; i < n; ++i)
        x[i] = T(double(i % 97) / 97 * 4 - 2);
    const double s = detail::typical_of(repeats, [&] {
        for (std::size_t i = 0; i < n; i += lanes) {
            const auto a = batch::load_unaligned(x.data() + i);
            (xsimd::erf(a) + xsimd::exp(a)).store_unaligned(y.data() + i);
        }
    });
    // The results are read below, so that the functions are not optimised away.
    volatile T keep = y[n / 2];
    (void)keep;
    return s / (2.0 * double(n));
}

/// Bytes/s of this rank's elementwise work as the cost model counts it: Momentum's update of
/// `n` elements of T as the optimizer runs it (optim's `momentum_pass`: reads the weight, the
/// gradient and the velocity, writes the weight and the velocity) and the gradient's zeroing,
/// six passes over `n` elements; a typical one of `repeats`. No communication.
template <class T>
double measure_update_bandwidth(std::size_t n, int repeats = 5) {
    std::vector<T> w(n, T(1)), g(n, T(0.5)), v(n, T(0.25));
    const double s = detail::typical_of(repeats, [&] {
        detail::momentum_pass(w.data(), v.data(), g.data(), n, T(0.9), T(1e-3), false);
        std::fill(g.begin(), g.end(), T(0));
    });
    // The weights are read below, so that the update is not optimised away.
    volatile T keep = w[n / 2];
    (void)keep;
    return 6.0 * double(n) * double(sizeof(T)) / std::max(s, 1e-9);
}

/// What `calibrate_links` times: per kind of step, a plan over all the communicator's p ranks
/// of a tensor of p doubles per rank (its latency) and one of about `elements` doubles (its
/// bandwidth), each the fastest of `repeats` runs.
struct link_sample {
    std::size_t elements = std::size_t(1) << 20; // 8 MiB
    int repeats = 3;
};

/// One plan `calibrate_links` timed: the kind of its step, the tensor's bytes, the seconds
/// measured (the slowest rank's) and those the model it started from predicts.
struct link_point {
    std::string kind;
    std::size_t bytes = 0;
    double seconds = 0;
    double predicted = 0;
};

/// The links fitted by `calibrate_links`, and what they were fitted on.
struct link_fit {
    cost_model links;
    std::vector<link_point> points;
};

namespace detail {

/// Seconds of one call of `f` for the slowest rank of `c`: the fastest of `repeats` runs of
/// `calls` calls, each run started together (a barrier). Collective over `c`.
template <class F>
double slowest_rank_seconds(const communicator& c, int repeats, int calls, F&& f) {
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r < repeats; ++r) {
        barrier(c);
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < calls; ++i)
            f();
        double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
        allreduce(c, std::span(&s, 1), reduction::max);
        best = std::min(best, s);
    }
    return best;
}

/// A timed redistribution plan: the slowest rank's seconds, the plan's summary on this rank
/// (its messages, bytes and copies, and the model's prediction) and the tensor's bytes.
struct timed_plan {
    double seconds = 0;
    plan_summary plan;
    std::size_t bytes = 0;
};

/// A redistribution plan From -> To of about `elements` doubles over the one axis of `m`,
/// built under `model` and `tuning`, and timed.
template <layout From, layout To>
timed_plan time_link_plan(const mesh<"x">& m, std::size_t elements, const cost_model& model,
                          const reduce_tuning& tuning, int repeats) {
    std::array<std::size_t, From.rank()> shape{};
    shape.fill(1);
    shape[0] = std::size_t(m.size());
    // A multiple of p per rank, so that every rank's blocks, messages and copies are alike
    // (and so the fit made from them).
    const std::size_t p = std::size_t(m.size());
    shape[From.rank() - 1] *= std::max<std::size_t>(1, elements / (p * p)) * p;
    auto src = full<double, From>(m, shape, 1.0);
    auto plan = make_redistribution<To>(src, To, model, tuning);
    auto dst = plan(src);
    const int calls = elements < 1024 ? 50 : 1;
    const double s =
        slowest_rank_seconds(m.comm(), repeats, calls, [&] { plan.execute_unchecked(src, dst); });
    return {s, plan.plan().summary(), src.size() * sizeof(double)};
}

} // namespace detail

/// `base` with its links fitted on the ranks of `c` (see `link_sample`): the local copy's
/// seconds per byte from a memcpy; then per kind of step (all_gather, all_to_all and
/// exchange, reduce_scatter through the pairwise algorithm, all_reduce through MPI) alpha
/// from the tiny plan and beta from the large one, after alpha and the copies. The same on
/// every rank. On one rank nothing moves: `base` as it is. Collective over `c`.
XSHARD_DECL link_fit calibrate_links(const communicator& c, const cost_model& base = {},
                                     const link_sample& sample = {});

namespace detail {

/// calibrate_axis_links on `shape`, with `groups[i]` this rank's group of axis i and `whole`
/// the mesh's communicator.
XSHARD_DECL link_fit calibrate_axis_links(const communicator& whole, const mesh_shape& shape,
                                          std::span<const communicator* const> groups,
                                          const cost_model& base, const link_sample& sample);

} // namespace detail

/// `base` with its links fitted level by level on the axes of `m` of more than one rank: on
/// each axis in turn, all its groups at once, `calibrate_links` over the group. The axis's
/// all_to_all link (pairwise messages over the axis: what its wires do) becomes its link of
/// its own (`cost_model::axis_links`; entries for other axes are kept), and the kinds' links
/// are those of the fastest axis (each kind's algorithm on the fastest wires). A step is
/// priced by the slower of its kind's link and its axes' (`cost_model::link`): on a mesh with
/// an axis across nodes and one within, the planner and the search price a step across nodes
/// by the network and one within by the node. Each figure is the slowest group's, the same on
/// every rank. `points` holds the plans timed, their kinds named "axis.kind". Without an axis
/// of more than one rank, `base` as it is. Collective over `m`.
///
///     mesh<"node", "local"> levels({nodes, ranks_per_node});
///     machine.links = xshard::calibrate_axis_links(levels, machine.links).links;
template <class Mesh>
link_fit calibrate_axis_links(const Mesh& m, const cost_model& base = {},
                              const link_sample& sample = {}) {
    std::array<const communicator*, Mesh::ndim> groups{};
    for (std::size_t i = 0; i < Mesh::ndim; ++i)
        groups[i] = &m.sub(axis_set::of(i));
    return detail::calibrate_axis_links(m.comm(), m.shape(), groups, base, sample);
}

/// The pieces `calibrate_reduce_tuning` times: per member, from `smallest` to `largest` bytes,
/// each four times the one before (by default 1 KiB to 4 MiB), each reduction through either
/// path the fastest of `repeats` runs. The pairwise path counts as fast as MPI's when it
/// takes at most `margin` times its seconds (1.05: within the noise of a run).
struct crossover_sample {
    std::size_t smallest = std::size_t(1) << 10;
    std::size_t largest = std::size_t(4) << 20;
    int repeats = 5;
    double margin = 1.05;
};

/// A reduction ("all_reduce" or "reduce_scatter") of pieces of `piece_bytes` per member,
/// timed through the pairwise path and through MPI's collective: the slowest rank's seconds.
struct crossover_point {
    std::string kind;
    std::size_t piece_bytes = 0;
    double pairwise = 0;
    double mpi = 0;
};

/// The crossovers fitted by `calibrate_reduce_tuning`, and what they were fitted on.
struct crossover_fit {
    reduce_tuning tuning;
    std::vector<crossover_point> points;
};

namespace detail {

/// The crossover that loses least over `points` (one kind's, by ascending piece): the piece
/// from which on the pairwise path runs (MPI's below), chosen among the points' pieces and
/// SIZE_MAX (MPI at every piece) to minimise the summed log of each piece's chosen seconds
/// over its faster path's. The pairwise path's seconds count divided by `margin`, so that
/// where the two are within the noise it is chosen; among equal choices the smallest piece.
/// One threshold cannot follow a path that wins, loses and wins again with the piece; this
/// one gives up least where it cannot.
inline std::size_t crossover_from(std::span<const crossover_point> points, double margin) {
    std::vector<double> pairwise_loss, mpi_loss; // log(seconds / the faster path's)
    for (const auto& x : points) {
        const double pairwise = x.pairwise / margin, best = std::min(pairwise, x.mpi);
        const bool timed = best > 0 && std::isfinite(pairwise) && std::isfinite(x.mpi);
        pairwise_loss.push_back(timed ? std::log(pairwise / best) : 0);
        mpi_loss.push_back(timed ? std::log(x.mpi / best) : 0);
    }
    // Threshold k: MPI for the pieces before k, the pairwise path from k on.
    double loss = 0;
    for (const double l : pairwise_loss)
        loss += l;
    std::size_t best_k = 0;
    double least = loss;
    for (std::size_t k = 1; k <= points.size(); ++k) {
        loss += mpi_loss[k - 1] - pairwise_loss[k - 1];
        if (loss < least - 1e-12) {
            least = loss;
            best_k = k;
        }
    }
    return best_k == points.size() ? SIZE_MAX : points[best_k].piece_bytes;
}

} // namespace detail

/// `base` with its crossovers between the pairwise reductions and MPI's collectives
/// (`min_piece_bytes`, `reduce_scatter_min_piece_bytes`) fitted on the ranks of `c`: for each
/// piece of `sample`, an all-reduce and a reduce-scatter of doubles over all of `c` through
/// each path; each crossover is the piece from which on the pairwise path loses least over
/// the pieces timed (`detail::crossover_from`; SIZE_MAX: MPI at every piece). Per piece, so
/// that a group of another size scales it, as the defaults do; fitted at `c`'s rank count
/// and on its network, where the defaults were fitted on one node. The same on every rank;
/// the other fields are `base`'s. On one rank nothing reduces, and a sample without a piece
/// fits nothing: `base` as it is. Collective over `c` (with the same `sample` on every
/// rank). Install the result for the plans made afterwards with `use_reduce_crossovers`.
XSHARD_DECL crossover_fit calibrate_reduce_tuning(const communicator& c,
                                                  const reduce_tuning& base = {},
                                                  const crossover_sample& sample = {});

/// The sizes measure_machine measures at: a narrow GEMM of [rows, in] x [in, out] (by default
/// a batch of 64 through a 1024 x 4096 layer, about 0.5 GFLOP), a square one of `square`
/// (512: about 0.27 GFLOP), together the GEMM's peak and how its speed falls on narrow shapes
/// (`fit_gemm`), and an update of `elements`
/// (by default 2^23: three arrays of 96 MiB of floats or 192 MiB of doubles, several times
/// a server's last-level cache, so that the bandwidth is the memory's and not the cache's:
/// at 2^21 floats a 32 MiB cache holds the arrays and the bandwidth measures twice the
/// memory's), each the median of `repeats` calls after an untimed one.
struct machine_sample {
    std::size_t rows = 64, in = 1024, out = 4096;
    std::size_t square = 512;
    std::size_t elements = std::size_t(1) << 23;
    /// Elements of the transcendental functions' sample (erf and exp; 2^14, a block the
    /// cache holds, as the kernels' runs are).
    std::size_t functions = std::size_t(1) << 14;
    int repeats = 5;
    /// How many times the four are measured in turn; each figure is the median of its rounds,
    /// so that a spell of other work on the machine slows one round of every figure, not
    /// every call of one.
    int rounds = 3;
    /// Whether to fit the links too (`calibrate_links`, at `links`' sizes).
    bool fit_links = true;
    link_sample links = {};
};

/// `m` with its GEMM peak (`gemm_flops`) and half dimension (`gemm_half_dimension`) fitted on
/// two GEMMs: one whose smallest dimension is `narrow_dimension` ran at `narrow` FLOP/s, one
/// whose smallest is `wide_dimension` at `wide`. The model's 1 / speed = (1 + h / d) / peak is
/// a line in 1 / d: the line through the two. A narrow GEMM no slower than the wide one (the
/// library's speed does not fall there, or noise) fits h = 0 at the wide one's speed; the
/// peak is at most twice the wide one's speed (the line then goes through the wide one).
XSHARD_DECL void fit_gemm(machine_model& m, double narrow, double narrow_dimension, double wide,
                          double wide_dimension);

/// `base` with the GEMM speed (`fit_gemm` on a narrow and a square GEMM), the memory
/// bandwidth and the transcendental functions' cost of the ranks of `c` measured on T, each
/// the median of `sample.rounds` and the slowest rank's (the same on every rank), its element
/// size set to T's, and its links fitted on `c`'s ranks (`calibrate_links`; unless
/// `sample.fit_links` is false). Collective over `c`: every rank measures at once.
template <class T>
machine_model measure_machine(const communicator& c, machine_model base = {},
                              const machine_sample& sample = {}) {
    // Each figure starts together on every rank (a barrier), so that the ranks run the same
    // kind of work at once, as in a step, not one rank's GEMM beside another's update.
    std::array<std::vector<double>, 4> rounds;
    for (int r = 0; r < std::max(sample.rounds, 1); ++r) {
        barrier(c);
        rounds[0].push_back(
            measure_gemm_flops<T>(sample.rows, sample.in, sample.out, sample.repeats));
        barrier(c);
        rounds[1].push_back(
            measure_gemm_flops<T>(sample.square, sample.square, sample.square, sample.repeats));
        barrier(c);
        rounds[2].push_back(measure_update_bandwidth<T>(sample.elements, sample.repeats));
        barrier(c);
        // As a rate, so that the slowest rank's is the least, as the others.
        rounds[3].push_back(1 /
                            measure_transcendental_seconds<T>(sample.functions, sample.repeats));
    }
    std::array<double, 4> figures{detail::median(rounds[0]), detail::median(rounds[1]),
                                  detail::median(rounds[2]), detail::median(rounds[3])};
    allreduce(c, std::span(figures), reduction::min);
    fit_gemm(base, figures[0], double(std::min({sample.rows, sample.in, sample.out})), figures[1],
             double(sample.square));
    base.memory_bandwidth = figures[2];
    base.transcendental_seconds = 1 / figures[3];
    base.element = sizeof(T);
    if (sample.fit_links)
        base.links = calibrate_links(c, base.links, sample.links).links;
    return base;
}

/// `base` with the factors of the primitives (`machine_model::op_scale`) fitted on a profiled
/// step: `measured` is the profile (graph/profile.hpp) of a program compiled with the strategy
/// `priced`, which the search found with `base`. Per primitive, the seconds its nodes'
/// kernels and VJPs took per step, on the slowest rank, over the compute `priced` gave them,
/// times the factor they were priced with; the redistributions and the gradient
/// synchronisation keep their prices (the links). A primitive priced at no time keeps its
/// factor. Then the search prices this program, and programs of the same shapes, as they run
/// on these ranks. Raises xshard::error on every rank when `measured` holds no pass of
/// `priced`'s nodes. Collective over `c`: three all-reduces of a few numbers.
XSHARD_DECL machine_model calibrate_ops(const communicator& c, machine_model base,
                                        const program_profile& measured,
                                        const program_strategy& priced);

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/search/calibrate.ipp>
#endif
