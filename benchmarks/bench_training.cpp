// One training step (forward, backward, gradient synchronisation, optimizer update and zeroing
// of the gradients) of xshard's tensor-parallel layers on p ranks, against the same step for
// the same global batch on a mesh of one rank (rank 0 alone, over MPI_COMM_SELF, while the
// other ranks wait in the harness's closing all-reduce: the baseline's time is rank 0's).
//
//   source scripts/env.sh; mpirun -n 2 build/benchmarks/bench_training
//
// Cases (f64 and f32 each; "tp<p>": mesh dp 1 x tp p, "dp<p>": mesh dp p x tp 1, the batch
// split over dp), all against baseline "one_rank":
//   mlp_step_*:         column_parallel_linear(1024 -> 4096), gelu, row_parallel_linear(4096 ->
//                       1024), batch 64, parallel_cross_entropy over the 1024 outputs as classes.
//   mlp_step_dp*_f64_batch512: the MLP in double with batch 512, data-parallel: where the
//                       products outweigh the weight-sized work (update, gradient all-reduce).
//   mlp_step_dp*_f64_node_storage: mlp_step_dp*_f64 with a node storage open (the one-off
//                       synchronize_gradients keeps messages; the weights stay on the heap).
//   mlp_step_dp*_f64_kept_sync, _kept_sync_node_storage: the same with one kept
//                       gradient_synchronizer instead of synchronize_gradients every step:
//                       its buckets go through shared memory on one node, node storage open
//                       or not (train/gradients.hpp).
//   mlp_step_dp*_f64_hsdp1, _hsdp2: the data-parallel MLP in double under optimizer sharding
//                       (xshard::hsdp, MindSpore's optimizer_level level1 / level2): the
//                       Momentum state and master weights split over dp, the updated blocks
//                       all-gathered; level2 reduce-scatters the gradients. Targets 1.5x.
//   mlp_step_dp*_f64_hsdp1_batch512: the same at batch 512, target 1.85x.
//   mlp_step_dp*_f64_hsdp3: level3 (weights gathered per layer, prefetched; target 1.25x);
//                       _hsdp2_overlap: level2 with the passes run through
//                       hsdp::forward/backward, which starts each layer's reduce-scatter as
//                       its backward finishes (the other level1/2 cases run them on the model).
//   memory_dp*_hsdp<L>: per-rank resident bytes between steps and the growth of the peak
//                       resident set during a step, at level L (0: no sharding).
//   optimizer_state_bytes_dp*_hsdp1: per-rank bytes of optimizer state and master weights
//                       at level1 against those without sharding ("ratio", target <= 0.55).
//   transformer_step_*: one nn::transformer_block (512 features, 8 heads, MLP hidden 2048),
//                       8 sequences of 64 tokens, parallel_cross_entropy over the 512 outputs.
// Labels are random; the optimizer is Momentum (lr 1e-3, 0.9); gradients are synchronised as
// the examples do (`synchronize_gradients(model, gradients_of{model})`). --quick shrinks
// everything to a few kilobytes. "bytes" is the size of the model's weights.
//
// After each case's JSON line comes a "<case>.communication" line:
//   speedup, target_speedup, target_met: baseline_seconds / seconds of the case's line, and
//       the aim: 85 % of p for tensor parallelism (1.7x on 2 ranks), 90 % for data
//       parallelism (1.8x); reported, not asserted.
//   step_seconds, forward_backward_seconds, gradient_sync_seconds, optimizer_seconds: per rank,
//       medians over --reps more steps timed phase by phase (optimizer: update and zero_grad).
//   mpi_in_forward_backward_seconds: per rank, the time spent inside MPI calls during forward
//       and backward (the layers' all-reduces, the loss's; counted by intercepting the MPI
//       calls xshard makes, through the MPI profiling interface). It includes waiting for the
//       other ranks, and leaves out the local additions of xshard's pairwise all-reduce.
//   weight_gather_seconds: per rank, hsdp's all-gather of the updated weights (0 without).
//   communication_seconds, share: per rank, mpi_in_forward_backward + gradient_sync +
//       weight_gather, and its
//       fraction of step_seconds.
//   baseline_forward_backward_seconds, baseline_optimizer_seconds: the one-rank step's phases.
//   hsdp cases also: hsdp_compute_seconds (the layers), hsdp_gather_exposed_seconds and
//       hsdp_reduce_exposed_seconds (time spent starting and waiting for all-gathers and
//       gradient reductions: the communication compute did not hide), hsdp_local_copy_seconds,
//       communication_alone_seconds (the step's collectives run alone,
//       best of 3) and "overlapped" = 1 - exposed / alone.

#include "harness.hpp"

#include <xshard/auto_parallel.hpp>
#include <xshard/core.hpp>
#include <xshard/nn.hpp>
#include <xshard/tensor.hpp>
#include <xshard/train.hpp>

#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace bench = xshard::bench;
namespace nn = xshard::nn;
using mesh_t = xshard::mesh<"dp", "tp">;

// ---------------------------------------------------------------------------------------------
// Time inside MPI: the calls xshard's collectives, redistributions and all-reduces make, each
// forwarded to its PMPI_ name and timed while `mpi_clock.counting` is set.

namespace {
struct {
    bool counting = false;
    double seconds = 0;
} mpi_clock;

template <class F>
int timed(F&& call) {
    if (!mpi_clock.counting)
        return call();
    const double start = PMPI_Wtime();
    const int code = call();
    mpi_clock.seconds += PMPI_Wtime() - start;
    return code;
}
} // namespace

extern "C" {
int MPI_Allreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
    return timed([&] { return PMPI_Allreduce(s, r, n, t, op, c); });
}
int MPI_Iallreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                   MPI_Request* q) {
    return timed([&] { return PMPI_Iallreduce(s, r, n, t, op, c, q); });
}
int MPI_Allgather(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt,
                  MPI_Comm c) {
    return timed([&] { return PMPI_Allgather(s, sn, st, r, rn, rt, c); });
}
int MPI_Allgatherv(const void* s, int sn, MPI_Datatype st, void* r, const int rn[], const int rd[],
                   MPI_Datatype rt, MPI_Comm c) {
    return timed([&] { return PMPI_Allgatherv(s, sn, st, r, rn, rd, rt, c); });
}
int MPI_Alltoall(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt,
                 MPI_Comm c) {
    return timed([&] { return PMPI_Alltoall(s, sn, st, r, rn, rt, c); });
}
int MPI_Alltoallv(const void* s, const int sn[], const int sd[], MPI_Datatype st, void* r,
                  const int rn[], const int rd[], MPI_Datatype rt, MPI_Comm c) {
    return timed([&] { return PMPI_Alltoallv(s, sn, sd, st, r, rn, rd, rt, c); });
}
int MPI_Reduce_scatter(const void* s, void* r, const int rn[], MPI_Datatype t, MPI_Op op,
                       MPI_Comm c) {
    return timed([&] { return PMPI_Reduce_scatter(s, r, rn, t, op, c); });
}
int MPI_Reduce_scatter_block(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
    return timed([&] { return PMPI_Reduce_scatter_block(s, r, n, t, op, c); });
}
int MPI_Bcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c) {
    return timed([&] { return PMPI_Bcast(b, n, t, root, c); });
}
int MPI_Barrier(MPI_Comm c) {
    return timed([&] { return PMPI_Barrier(c); });
}
int MPI_Send(const void* b, int n, MPI_Datatype t, int to, int tag, MPI_Comm c) {
    return timed([&] { return PMPI_Send(b, n, t, to, tag, c); });
}
int MPI_Recv(void* b, int n, MPI_Datatype t, int from, int tag, MPI_Comm c, MPI_Status* st) {
    return timed([&] { return PMPI_Recv(b, n, t, from, tag, c, st); });
}
int MPI_Sendrecv(const void* s, int sn, MPI_Datatype stype, int to, int stag, void* r, int rn,
                 MPI_Datatype rtype, int from, int rtag, MPI_Comm c, MPI_Status* st) {
    return timed(
        [&] { return PMPI_Sendrecv(s, sn, stype, to, stag, r, rn, rtype, from, rtag, c, st); });
}
int MPI_Isend(const void* b, int n, MPI_Datatype t, int to, int tag, MPI_Comm c, MPI_Request* q) {
    return timed([&] { return PMPI_Isend(b, n, t, to, tag, c, q); });
}
int MPI_Irecv(void* b, int n, MPI_Datatype t, int from, int tag, MPI_Comm c, MPI_Request* q) {
    return timed([&] { return PMPI_Irecv(b, n, t, from, tag, c, q); });
}
int MPI_Wait(MPI_Request* q, MPI_Status* st) {
    return timed([&] { return PMPI_Wait(q, st); });
}
int MPI_Waitall(int n, MPI_Request q[], MPI_Status st[]) {
    return timed([&] { return PMPI_Waitall(n, q, st); });
}
int MPI_Test(MPI_Request* q, int* done, MPI_Status* st) {
    return timed([&] { return PMPI_Test(q, done, st); });
}
}

// ---------------------------------------------------------------------------------------------

/// The phases of one step on this rank, in seconds (gather: optimizer sharding's all-gather of
/// the updated weights).
struct phases {
    double step = 0, forward_backward = 0, mpi_in_forward_backward = 0, sync = 0, optimizer = 0,
           gather = 0;
};

/// A model with its loss, optimizer and one batch (rows split over dp): `step()` is one
/// training step.
template <class T, class Model>
class trainer {
public:
    trainer(const mesh_t& mesh, Model model, std::size_t rows, std::size_t features,
            int hsdp_level = 0, bool overlap = false)
        : model_(std::move(model))
        , x_(xshard::generate<xshard::dynamic_layout(2)>(
              mesh, std::array{rows, features}, std::mt19937(11), std::normal_distribution<T>(0, 1),
              nn::make_layout({"dp", ""})))
        , labels_(xshard::generate<xshard::dynamic_layout(1)>(
              mesh, std::array{rows}, std::mt19937(12),
              std::uniform_int_distribution<std::int64_t>(0, std::int64_t(features) - 1),
              nn::make_layout({"dp"})))
        , hsdp_level_(hsdp_level)
        , overlap_(overlap) {}

    /// One step; its phases timed into `*p` if given.
    void step(phases* p = nullptr) {
        const double start = MPI_Wtime();
        // Made at the first step, once the trainer has stopped moving (it points into the
        // model).
        if (hsdp_level_ > 0 && !sharding_)
            sharding_ = std::make_unique<xshard::hsdp<Model>>(
                model_,
                xshard::hsdp_options{.optimizer_level = xshard::optimizer_level(hsdp_level_)});
        mpi_clock.seconds = 0;
        mpi_clock.counting = p != nullptr;
        if (sharding_ && (overlap_ || hsdp_level_ == 3)) {
            // Layer by layer: level3 gathers, the reductions start as each layer finishes.
            loss_value_ = loss_.forward(sharding_->forward(x_), labels_);
            sharding_->backward(loss_.backward());
        } else {
            loss_value_ = loss_.forward(model_.forward(x_), labels_);
            model_.backward(loss_.backward());
        }
        mpi_clock.counting = false;
        const double backward_done = MPI_Wtime();
        double gather = 0;
        if (sharding_) {
            sharding_->synchronize_gradients();
        } else if (keep_synchronizer_) {
            if (!sync_) { // made once the trainer has stopped moving (it points into the model)
                grads_ = std::make_unique<xshard::gradients_of<Model>>(model_);
                sync_ = std::make_unique<xshard::gradient_synchronizer>(model_, *grads_);
            }
            sync_->synchronize();
        } else {
            auto grads = xshard::gradients_of{model_};
            xshard::synchronize_gradients(model_, grads);
        }
        const double sync_done = MPI_Wtime();
        optimizer_.step(model_);
        if (sharding_ && hsdp_level_ < 3) {
            const double gather_start = MPI_Wtime();
            sharding_->gather_weights();
            gather = MPI_Wtime() - gather_start;
        }
        xshard::for_each_weight(model_, [](const std::string&, auto& w) { w.zero_grad(); });
        const double end = MPI_Wtime();
        if (p)
            *p = {end - start,
                  backward_done - start,
                  mpi_clock.seconds,
                  sync_done - backward_done,
                  end - sync_done - gather,
                  gather};
    }

    /// Synchronises the gradients with one kept `gradient_synchronizer` (its buffers and
    /// windows made once) rather than `synchronize_gradients` every step.
    void keep_synchronizer() { keep_synchronizer_ = true; }

    /// Optimizer sharding's phase timings (none without).
    std::optional<xshard::hsdp_timings> hsdp_timings() const {
        if (!sharding_)
            return std::nullopt;
        return sharding_->timings();
    }
    void reset_hsdp_timings() {
        if (sharding_)
            sharding_->reset_timings();
    }
    /// The seconds of one step's communication alone (hsdp::time_communication; 0 without).
    double communication_alone() { return sharding_ ? sharding_->time_communication() : 0; }

    /// The bytes of the largest weight (global): level3's unit of gathering in the MLP.
    std::size_t largest_weight_bytes() {
        std::size_t n = 0;
        xshard::for_each_weight(model_, [&](const std::string&, auto& w) {
            n = std::max(n, w.value.size() * sizeof(T));
        });
        return n;
    }

    /// The per-rank bytes of the optimizer's state and master weights (after a step).
    std::size_t state_bytes() { return xshard::optimizer_state_bytes(model_); }

    /// The bytes of the model's weights (global).
    std::size_t bytes() {
        std::size_t n = 0;
        xshard::for_each_weight(
            model_, [&](const std::string&, auto& w) { n += w.value.size() * sizeof(T); });
        return n;
    }

private:
    Model model_;
    nn::tensor<T, mesh_t> x_;
    nn::tensor<std::int64_t, mesh_t, 1> labels_;
    nn::parallel_cross_entropy<T, mesh_t> loss_;
    xshard::optim::momentum optimizer_{{.lr = 1e-3, .momentum = 0.9}};
    T loss_value_ = 0;
    int hsdp_level_ = 0;
    bool overlap_ = false; ///< under sharding, the passes through hsdp::forward / backward
    std::unique_ptr<xshard::hsdp<Model>> sharding_;
    bool keep_synchronizer_ = false;
    std::unique_ptr<xshard::gradients_of<Model>> grads_;
    std::unique_ptr<xshard::gradient_synchronizer> sync_;
};

template <class T, class Model>
trainer<T, Model> make_trainer(const mesh_t& mesh, Model model, std::size_t rows,
                               std::size_t features, int hsdp_level = 0, bool overlap = false) {
    return trainer<T, Model>(mesh, std::move(model), rows, features, hsdp_level, overlap);
}

struct mlp_sizes {
    std::size_t features, hidden, batch;
};

template <class T>
auto make_mlp(const mesh_t& mesh, const mlp_sizes& s, int hsdp_level = 0, bool overlap = false) {
    return make_trainer<T>(
        mesh,
        nn::sequential(nn::column_parallel_linear<T, mesh_t>(mesh, s.features, s.hidden, 1),
                       nn::gelu_activation<T, mesh_t>(mesh),
                       nn::row_parallel_linear<T, mesh_t>(mesh, s.hidden, s.features, 2)),
        s.batch, s.features, hsdp_level, overlap);
}

struct transformer_sizes {
    std::size_t features, heads, sequence, sequences, hidden;
};

template <class T>
auto make_transformer(const mesh_t& mesh, const transformer_sizes& s) {
    return make_trainer<T>(
        mesh,
        nn::transformer_block<T, mesh_t>(
            mesh, s.features, 3, {.heads = s.heads, .sequence = s.sequence, .hidden = s.hidden}),
        s.sequences * s.sequence, s.features);
}

/// The median of each phase over `v`.
phases medians(const std::vector<phases>& v) {
    auto of = [&](double phases::*field) {
        std::vector<double> x;
        for (const auto& p : v)
            x.push_back(p.*field);
        return bench::median(x);
    };
    return {of(&phases::step), of(&phases::forward_backward), of(&phases::mpi_in_forward_backward),
            of(&phases::sync), of(&phases::optimizer),        of(&phases::gather)};
}

/// A JSON array of `value` from every rank of `c` (on rank 0; empty elsewhere).
std::string per_rank(const xshard::communicator& c, double value) {
    std::vector<double> all(std::size_t(c.size()));
    xshard::mpi::gather(c, std::span(&value, 1),
                        c.rank() == 0 ? std::span(all) : std::span(all).first(0), 0);
    std::string out = "[";
    char number[32];
    for (std::size_t r = 0; r < all.size(); ++r) {
        std::snprintf(number, sizeof number, "%.4g", all[r]);
        out += (r ? ", " : "") + std::string(number);
    }
    return out + "]";
}

/// Runs case `name`: the step of `make(mesh)` against that of `make(one)` on rank 0.
template <class Make>
void run_case(const bench::options& o, const std::string& name, const mesh_t& mesh,
              const std::optional<mesh_t>& one, double target_efficiency, Make&& make) {
    if (!o.wants(name))
        return;
    const auto& c = mesh.comm();
    auto ours = make(mesh);
    std::optional<decltype(make(mesh))> theirs;
    if (one)
        theirs.emplace(make(*one));
    const auto t = bench::compare(
        c, o, [&] { ours.step(); },
        [&] {
            if (theirs)
                theirs->step();
        });
    bench::report(c, name, ours.bytes(), "one_rank", t);

    std::vector<phases> mine(std::size_t(o.reps)), base(std::size_t(o.reps));
    ours.reset_hsdp_timings();
    for (auto& p : mine) {
        xshard::mpi::barrier(c);
        ours.step(&p);
    }
    const auto ht = ours.hsdp_timings();
    // The step's communication alone (best of 3), against what the steps left exposed.
    double alone = 0;
    if (ht)
        for (int k = 0; k < 3; ++k) {
            xshard::mpi::barrier(c);
            const double a = ours.communication_alone();
            alone = k == 0 ? a : std::min(alone, a);
        }
    if (theirs)
        for (auto& p : base)
            theirs->step(&p);
    xshard::mpi::barrier(c);
    const auto m = medians(mine), b = medians(base);
    const double speedup = t.baseline_seconds / t.seconds,
                 target = target_efficiency * double(c.size()),
                 communication = m.mpi_in_forward_backward + m.sync + m.gather;
    const auto steps = per_rank(c, m.step), forward_backward = per_rank(c, m.forward_backward),
               mpi = per_rank(c, m.mpi_in_forward_backward), sync = per_rank(c, m.sync),
               optimizer = per_rank(c, m.optimizer), gather = per_rank(c, m.gather),
               comm = per_rank(c, communication), share = per_rank(c, communication / m.step);
    std::string hsdp_fields;
    if (ht) {
        const double reps = double(o.reps);
        const double exposed = (ht->gather_wait + ht->reduce_wait) / reps;
        const double overlap = alone > 0 ? std::max(0.0, 1 - exposed / alone) : 0;
        hsdp_fields = ", \"hsdp_compute_seconds\": " + per_rank(c, ht->compute / reps) +
                      ", \"hsdp_gather_exposed_seconds\": " + per_rank(c, ht->gather_wait / reps) +
                      ", \"hsdp_reduce_exposed_seconds\": " + per_rank(c, ht->reduce_wait / reps) +
                      ", \"hsdp_local_copy_seconds\": " + per_rank(c, ht->local_copies / reps) +
                      ", \"communication_alone_seconds\": " + per_rank(c, alone) +
                      ", \"overlapped\": " + per_rank(c, overlap);
    }
    if (c.rank() != 0)
        return;
    std::printf("{\"name\": \"%s.communication\", \"ranks\": %d, \"speedup\": %.3f, "
                "\"target_speedup\": %.2f, \"target_met\": %s, \"step_seconds\": %s, "
                "\"forward_backward_seconds\": %s, \"mpi_in_forward_backward_seconds\": %s, "
                "\"gradient_sync_seconds\": %s, \"optimizer_seconds\": %s, "
                "\"weight_gather_seconds\": %s, "
                "\"communication_seconds\": %s, \"share\": %s, "
                "\"baseline_forward_backward_seconds\": %.4g, "
                "\"baseline_optimizer_seconds\": %.4g%s}\n",
                name.c_str(), c.size(), speedup, target, speedup >= target ? "true" : "false",
                steps.c_str(), forward_backward.c_str(), mpi.c_str(), sync.c_str(),
                optimizer.c_str(), gather.c_str(), comm.c_str(), share.c_str(), b.forward_backward,
                b.optimizer, hsdp_fields.c_str());
    std::fflush(stdout);
    std::fprintf(stderr,
                 "%s: %.2fx faster than one rank (target %.2fx: %s), communication %.0f %%\n",
                 name.c_str(), speedup, target, speedup >= target ? "met" : "missed",
                 100 * communication / m.step);
}

/// The per-rank bytes of the MLP's optimizer state and master weights under hsdp level1
/// against those without sharding (its "ratio": target <= 0.55 at dp = 2).
void state_bytes_case(const bench::options& o, const std::string& name, const mesh_t& mesh,
                      const mlp_sizes& s) {
    if (!o.wants(name))
        return;
    auto sharded = make_mlp<double>(mesh, s, 1), plain = make_mlp<double>(mesh, s, 0);
    sharded.step();
    plain.step();
    const std::size_t mine = sharded.state_bytes(), full = plain.state_bytes();
    const auto& c = mesh.comm();
    if (c.rank() != 0)
        return;
    const double ratio = double(mine) / double(full);
    std::printf("{\"name\": \"%s\", \"ranks\": %d, \"bytes\": %zu, \"baseline\": \"unsharded\", "
                "\"baseline_bytes\": %zu, \"ratio\": %.4f, \"target_ratio\": 0.55, "
                "\"target_met\": %s}\n",
                name.c_str(), c.size(), mine, full, ratio, ratio <= 0.55 ? "true" : "false");
    std::fflush(stdout);
}

/// The resident memory of the data-parallel MLP at hsdp level `level` (0: none), per rank:
/// "resident_bytes" between steps (against before the model was made), and
/// "step_peak_growth_bytes", the growth of the peak resident set during one step, and
/// "peak_bytes" their sum. "level3_bound_bytes": 1/dp of the weights' value, gradient and
/// momentum plus the largest layer in use and one prefetched (what level3 should hold; the
/// layer's full gradient during its backward and the exchanges' staging buffers come on top).
void memory_case(const bench::options& o, const std::string& name, const mesh_t& mesh,
                 const mlp_sizes& s, int level) {
    if (!o.wants(name))
        return;
    const auto& c = mesh.comm();
    const auto before = bench::resident_bytes().first;
    std::size_t resident = 0, growth = 0, weights = 0, largest = 0;
    {
        auto t = make_mlp<double>(mesh, s, level);
        t.step();
        t.step();
        xshard::mpi::barrier(c);
        const auto between = bench::resident_bytes().first;
        bench::reset_peak();
        t.step();
        const auto peak = bench::resident_bytes().second;
        resident = between - std::min(between, before);
        growth = peak - std::min(peak, between);
        weights = t.bytes();
        largest = t.largest_weight_bytes();
    }
    const std::size_t dp = std::size_t(mesh.shape().axis_size("dp"));
    // Level3: the sharded value, gradient and momentum, and the largest layer in use and one
    // prefetched.
    const std::size_t bound = 3 * weights / dp + 2 * largest;
    const auto r = per_rank(c, double(resident)), g = per_rank(c, double(growth)),
               peak = per_rank(c, double(resident + growth));
    if (c.rank() != 0)
        return;
    std::printf("{\"name\": \"%s\", \"ranks\": %d, \"bytes\": %zu, \"level\": %d, "
                "\"resident_bytes\": %s, \"step_peak_growth_bytes\": %s, \"peak_bytes\": %s, "
                "\"largest_weight_bytes\": %zu, \"level3_bound_bytes\": %zu}\n",
                name.c_str(), c.size(), weights, level, r.c_str(), g.c_str(), peak.c_str(), largest,
                bound);
    std::fflush(stdout);
}

/// The training driver's step (xshard::model over auto_parallel, default configuration)
/// against the manual loop's (`trainer`) on the same mesh and MLP: target ratio <= 1.02.
void driver_case(const bench::options& o, const std::string& name, const mesh_t& mesh,
                 const mlp_sizes& s) {
    if (!o.wants(name))
        return;
    auto manual = make_mlp<double>(mesh, s);
    auto net =
        nn::sequential(nn::column_parallel_linear<double, mesh_t>(mesh, s.features, s.hidden, 1),
                       nn::gelu_activation<double, mesh_t>(mesh),
                       nn::row_parallel_linear<double, mesh_t>(mesh, s.hidden, s.features, 2));
    const auto x = xshard::generate<xshard::dynamic_layout(2)>(
        mesh, std::array{s.batch, s.features}, std::mt19937(11),
        std::normal_distribution<double>(0, 1), nn::make_layout({"dp", ""}));
    const auto labels = xshard::generate<xshard::dynamic_layout(1)>(
        mesh, std::array{s.batch}, std::mt19937(12),
        std::uniform_int_distribution<std::int64_t>(0, std::int64_t(s.features) - 1),
        nn::make_layout({"dp"}));
    xshard::auto_parallel parallel(net, mesh);
    nn::parallel_cross_entropy<double, mesh_t> loss;
    xshard::optim::momentum optimizer({.lr = 1e-3, .momentum = 0.9});
    xshard::model driver(parallel, loss, optimizer);
    const auto& c = mesh.comm();
    const auto t = bench::compare(
        c, o, [&] { (void)driver.train_step(x, labels); }, [&] { manual.step(); });
    bench::report(c, name, manual.bytes(), "manual", t);
    if (c.rank() == 0) {
        const double ratio = t.seconds / t.baseline_seconds;
        std::fprintf(stderr, "%s: driver / manual %.3f (target <= 1.02: %s)\n", name.c_str(), ratio,
                     ratio <= 1.02 ? "met" : "missed");
    }
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const auto o = bench::options::parse(argc, argv);
    const mesh_t tp({1, xshard::auto_size}), dp({xshard::auto_size, 1});
    const auto& c = tp.comm();
    std::optional<mesh_t> one; // the baseline's mesh: rank 0 alone
    if (c.rank() == 0)
        one.emplace(xshard::communicator::self(), std::array{1, 1});
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    const char* threads = std::getenv("OPENBLAS_NUM_THREADS");
    if (c.rank() == 0)
        std::fprintf(stderr,
                     "bench_training: %d ranks, OPENBLAS_CORETYPE=%s OPENBLAS_NUM_THREADS=%s\n",
                     c.size(), coretype ? coretype : "(unset)", threads ? threads : "(unset)");

    const mlp_sizes mlp = o.quick ? mlp_sizes{64, 256, 16} : mlp_sizes{1024, 4096, 64};
    const transformer_sizes block =
        o.quick ? transformer_sizes{32, 4, 8, 4, 64} : transformer_sizes{512, 8, 64, 8, 2048};
    const std::string p = std::to_string(c.size());
    constexpr double tp_efficiency = 0.85, dp_efficiency = 0.9;

    // The MLP cases, then the transformer's; double precision, then single.
    auto mlp_cases = [&](auto zero, const std::string& type) {
        auto make = [&](const mesh_t& m) {
            return make_mlp<decltype(zero)>(m, mlp);
        };
        run_case(o, "mlp_step_tp" + p + "_" + type, tp, one, tp_efficiency, make);
        run_case(o, "mlp_step_dp" + p + "_" + type, dp, one, dp_efficiency, make);
    };
    auto transformer_cases = [&](auto zero, const std::string& type) {
        auto make = [&](const mesh_t& m) {
            return make_transformer<decltype(zero)>(m, block);
        };
        run_case(o, "transformer_step_tp" + p + "_" + type, tp, one, tp_efficiency, make);
        run_case(o, "transformer_step_dp" + p + "_" + type, dp, one, dp_efficiency, make);
    };
    // Memory per level, first (before other cases leave freed heap blocks for reuse). glibc
    // returns freed blocks to the system only when they were mmapped: a fixed threshold of
    // 1 MiB (for the whole run, from here on) keeps it from raising its own, so frees show.
    bool memory = false;
    for (int level : {0, 1, 2, 3})
        memory = memory || o.wants("memory_dp" + p + "_hsdp" + std::to_string(level));
    if (memory) {
        mallopt(M_MMAP_THRESHOLD, 1 << 20);
        for (int level : {0, 1, 2, 3})
            memory_case(o, "memory_dp" + p + "_hsdp" + std::to_string(level), dp, mlp, level);
    }
    mlp_cases(double{}, "f64");
    // The same data-parallel step with a kept gradient_synchronizer, and with a node storage
    // open too: either way its buckets are all-reduced through shared memory on one node, the
    // fused ones on the gradients (train/gradients.hpp; the weights stay on the heap, so every
    // bucket stages the parts the other ranks reduce).
    auto kept = [&](const mesh_t& m) {
        auto t = make_mlp<double>(m, mlp);
        t.keep_synchronizer();
        return t;
    };
    run_case(o, "mlp_step_dp" + p + "_f64_kept_sync", dp, one, dp_efficiency, kept);
    if (const auto name = "mlp_step_dp" + p + "_f64_kept_sync_node_storage"; o.wants(name)) {
        const xshard::node_storage storage(c, std::size_t(64) << 20);
        run_case(o, name, dp, one, dp_efficiency, kept);
    }
    if (const auto name = "mlp_step_dp" + p + "_f64_node_storage"; o.wants(name)) {
        const xshard::node_storage storage(c, std::size_t(64) << 20);
        run_case(o, name, dp, one, dp_efficiency,
                 [&](const mesh_t& m) { return make_mlp<double>(m, mlp); });
    }
    driver_case(o, "mlp_step_tp" + p + "_f64_driver", tp, mlp);
    run_case(o, "mlp_step_dp" + p + "_f64_batch512", dp, one, dp_efficiency, [&](const mesh_t& m) {
        return make_mlp<double>(m, {mlp.features, mlp.hidden, 8 * mlp.batch});
    });
    // Optimizer sharding (hsdp level1, level2, level3) of the data-parallel MLP, targets 1.5x,
    // 1.25x at level3, and (batch 512) 1.85x; level2 also with the passes through
    // hsdp::forward / backward (reduce-scatters started as each layer finishes; level3 always).
    for (int level : {1, 2, 3})
        run_case(o, "mlp_step_dp" + p + "_f64_hsdp" + std::to_string(level), dp, one,
                 level == 3 ? 0.625 : 0.75,
                 [&](const mesh_t& m) { return make_mlp<double>(m, mlp, level); });
    run_case(o, "mlp_step_dp" + p + "_f64_hsdp2_overlap", dp, one, 0.75,
             [&](const mesh_t& m) { return make_mlp<double>(m, mlp, 2, true); });
    run_case(o, "mlp_step_dp" + p + "_f64_hsdp1_batch512", dp, one, 0.925, [&](const mesh_t& m) {
        return make_mlp<double>(m, {mlp.features, mlp.hidden, 8 * mlp.batch}, 1);
    });
    state_bytes_case(o, "optimizer_state_bytes_dp" + p + "_hsdp1", dp, mlp);
    mlp_cases(float{}, "f32");
    transformer_cases(double{}, "f64");
    transformer_cases(float{}, "f32");
    return 0;
}
