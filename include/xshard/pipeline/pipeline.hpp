#pragma once
/// \file
/// The pipeline runtime (MindSpore's `Pipeline` cell with `pipeline(stages, output_broadcast,
/// interleave, scheduler)`, and `PipelineGradReducer`).
///
/// A mesh axis (say "pp") holds the stages: the ranks that differ only along it are one
/// pipeline, and each stage runs its layers on the sub-mesh of the other axes (dp x tp, the
/// *stage mesh*), so tensor and data parallelism compose with pipelining. The model is a
/// chain: its modules, in the order its `visit_parameters` lists them (an `nn::sequential`,
/// or a user module like MindSpore's Network), each a layer with `forward(x)` and
/// `backward(dy)` on one tensor type, built on the stage mesh on every rank alike. The chain
/// is cut into p v virtual stages (by name, by position or balanced, stages.hpp); virtual
/// stage s runs on pipeline rank s mod p.
///
/// A step splits the batch into m micro-batches (step_batch.hpp, micro_batch.hpp) and walks
/// this rank's row of the schedule table (step.hpp, schedule.hpp): forward passes keep their
/// activations in a slot per micro-batch in flight (slots.hpp, chain.hpp: a copy of the
/// stage's layers without weights, the weights lent in for each pass by a few pointer
/// swaps), the last stage computes the loss of each micro-batch and its gradient at once
/// (scaled by the micro-batch's share of the rows, so the step's loss and gradients are the
/// whole batch's mean), backward passes add into the weights' gradients, and activations
/// and gradients travel between neighbouring stages without blocking (step_transfers.hpp;
/// where the stages are and which boundaries are cross-mesh, topology.hpp).
/// `synchronize_gradients()` (PipelineGradReducer) then sums the gradients over each
/// stage's data-parallel copies once per step. `predict` runs the forward passes alone
/// (inference): each stage with its own weights, the last stage's output sent to every stage
/// with `output_broadcast`.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/pipeline/action.hpp>
#include <xshard/pipeline/analysis.hpp>
#include <xshard/pipeline/chain.hpp>
#include <xshard/pipeline/schedule.hpp>
#include <xshard/pipeline/stage_view.hpp>
#include <xshard/pipeline/stages.hpp>
#include <xshard/pipeline/step.hpp>
#include <xshard/pipeline/step_batch.hpp>
#include <xshard/pipeline/step_transfers.hpp>
#include <xshard/pipeline/topology.hpp>
#include <xshard/redistribute/redistribute.hpp>
#include <xshard/train/gradients.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard::pipeline {

/// How to run a pipeline: MindSpore's `pipeline(stages, output_broadcast, interleave,
/// scheduler)` plus the micro-batch count and the stage assignment (`stage_config`, or
/// `stage_starts`, or neither: balanced by parameters).
struct pipeline_options {
    int micro_batches = 1;
    schedule_kind scheduler = schedule_kind::one_f_one_b;
    /// Virtual stages per rank: 2 or more with the interleaved scheduler (MindSpore's
    /// interleave=True).
    int virtual_stages = 1;
    /// Module path -> (virtual) stage (stages_by_name: dotted paths at any depth, MindSpore's
    /// "_backbone." prefix allowed); modules not named take the stage of the module before.
    std::map<std::string, int> stage_config = {};
    /// Or by position: the index of the first module of stages 1, 2, ...
    std::vector<std::size_t> stage_starts = {};
    /// Whether every stage learns a step's loss (a broadcast over the pipeline axis) and
    /// `predict`'s output, not only the last.
    bool output_broadcast = false;
    /// (Virtual) stage -> the layout that stage receives its input activations in, on its
    /// own stage mesh; a stage not named receives them in the notation they were sent in.
    /// Where a stage's layout or mesh shape differs from its predecessor's, the transfer is a
    /// cross-mesh redistribution (boundary.hpp).
    std::map<int, layout> stage_input_layouts = {};
};

/// A model run as a pipeline over axis `axis` of a mesh (see the file comment). `X` is the
/// activations' type (e.g. `nn::tensor<double, StageMesh>`, on the stage mesh); the model
/// must outlive the pipeline.
template <class Model, distributed_tensor X>
class pipeline {
public:
    using stage_mesh_type = typename X::mesh_type;
    using value_type = typename X::value_type;

    /// Builds the pipeline of `model` over axis `axis` of `mesh` (whose other axes make
    /// `stage_mesh`, on which the model's layers live). Collective over `mesh`; every misuse
    /// (a stage with no layers, stage_config naming an unknown module, an invalid schedule,
    /// a stage mesh of another size than the other axes') throws `xshard::error` on every
    /// rank before any data moves. Make `stage_mesh` with `stage_mesh_of`.
    template <mesh_type FullMesh>
    pipeline(const FullMesh& mesh, std::string_view axis, const stage_mesh_type& stage_mesh,
             Model& model, pipeline_options options)
        : options_(std::move(options))
        , world_(mesh.comm())
        , topo_(stage_mesh, options_.stage_input_layouts)
        , model_(&model) {
        std::size_t a = 0;
        agreed_alike(world_, [&] {
            a = mesh.shape().index(axis);
            topo_.pp = mesh.sub(axis_set::of(a)).dup();
            topo_.config = {options_.scheduler, mesh.axis_size(a), options_.micro_batches,
                            options_.virtual_stages};
            const auto& pp = topo_.pp;
            if (stage_mesh.size() * pp.size() != mesh.size())
                throw error("xshard: pipeline: the stage mesh has " +
                            std::to_string(stage_mesh.size()) + " ranks, but " +
                            std::to_string(mesh.size()) + " ranks over " +
                            std::to_string(pp.size()) + " stages need " +
                            std::to_string(mesh.size() / pp.size()) + " per stage");
            make_table();
            collect();
            assign();
        });
        topo_.learn(mesh, a, X::rank);
        const int me = topo_.pp.rank();
        for (std::size_t i = 0; i < modules_.size(); ++i)
            if (topo_.config.rank_of_stage(stage_of_[i]) == me)
                local_names_.insert(modules_[i]->name);
    }

    pipeline(const pipeline&) = delete;
    pipeline& operator=(const pipeline&) = delete;

    /// One training step's forward and backward passes over `x` (the batch, [rows, ...]
    /// on the stage mesh; read by the first stage only) and `labels` (read by the last
    /// stage only), with `loss` (forward(logits, labels) -> value, backward(scale) -> the
    /// logits' gradient, e.g. nn::parallel_cross_entropy). Adds the batch's gradients to
    /// this rank's weights (as terms: call `synchronize_gradients()` next). Returns the
    /// batch's mean loss on the last stage (on every stage with output_broadcast; NaN on the
    /// others otherwise). Collective over the mesh; bad batch sizes throw on every rank
    /// before any data moves; an error during the passes (a layer or the loss throwing on
    /// some ranks) stops the step and throws on every rank, the gradients then holding part
    /// of the batch (zero_grad() before the next step); ranks of the failing one's stage
    /// waiting in a collective with it raise too (comm/watch.hpp). Besides the transfers,
    /// one all-gather of a byte per rank over the mesh (that agreement).
    template <distributed_tensor Labels, class Loss>
    value_type step(const X& x, const Labels& labels, Loss& loss) {
        std::optional<std::string> problem;
        if (!(x.mesh() == topo_.mesh) || !(labels.mesh() == topo_.mesh))
            problem = "xshard: pipeline: the batch and the labels must live on the pipeline's "
                      "stage mesh (" +
                      topo_.mesh.shape().to_string() + ")";
        else if (labels.shape()[0] != x.shape()[0])
            problem = "xshard: pipeline: " + std::to_string(labels.shape()[0]) +
                      " labels for a batch of " + std::to_string(x.shape()[0]) + " rows";
        return run_step(&x, &labels, loss, problem);
    }

    /// The step where each stage passes only what it reads (MindSpore's per-stage data
    /// loading): the batch on the first stage (`reads_inputs()`), the labels on the last
    /// (`reads_labels()`), null elsewhere: no other rank needs to touch the dataset.
    /// Otherwise as `step(x, labels, loss)`; a null pointer where one is needed throws on
    /// every rank before any data moves.
    template <distributed_tensor Labels, class Loss>
    value_type step(const X* x, const Labels* labels, Loss& loss) {
        return run_step(x, labels, loss, std::nullopt);
    }

    /// Whether this rank's stage reads the batch (the first stage) / the labels (the last).
    bool reads_inputs() const noexcept { return topo_.pp.rank() == 0; }
    bool reads_labels() const noexcept {
        return topo_.pp.rank() == topo_.config.rank_of_stage(last_stage());
    }

    /// MindSpore's `Model.predict` through the pipeline (its `output_broadcast` inference):
    /// the forward passes of `x` (the batch of any size, [rows, ...] on the stage mesh; read by
    /// the first stage only), cut into as many of the step's micro-batches as fit its rows
    /// (fitting_micro_batches), each stage running its own layers with its own weights (no
    /// stage needs another's) and passing activations on as in a step
    /// (make_forward_schedule). Returns the model's output for the whole batch, its
    /// micro-batches' outputs joined (join_micro_batches: rows split like the batch's, or
    /// whole), on the last stage; with output_broadcast also on every other stage (sent from
    /// the last stage's ranks to the corresponding ranks, or through a cross-mesh plan where
    /// the meshes differ); nothing elsewhere. Collective over the mesh; misuse and errors
    /// raise on every rank as in `step`. Leaves the gradients and `last_step()` alone.
    std::optional<X> predict(const X& x) {
        std::optional<std::string> problem;
        if (!(x.mesh() == topo_.mesh))
            problem = "xshard: pipeline: the batch must live on the pipeline's stage mesh (" +
                      topo_.mesh.shape().to_string() + ")";
        return run_predict(&x, std::move(problem), options_.output_broadcast);
    }

    /// `predict` where only the first stage passes the batch (null elsewhere).
    std::optional<X> predict(const X* x) {
        return run_predict(x, std::nullopt, options_.output_broadcast);
    }

    /// `predict` with the output on the last stage only, whatever output_broadcast says: for
    /// metrics computed there (the driver's eval).
    std::optional<X> predict_on_last_stage(const X* x) {
        return run_predict(x, std::nullopt, false);
    }

private:
    /// The step on `x` (read on the first stage only) and `labels` (the last stage only),
    /// `problem` a misuse the caller found.
    template <distributed_tensor Labels, class Loss>
    value_type run_step(const X* x, const Labels* labels, Loss& loss,
                        std::optional<std::string> problem) {
        const auto t0 = detail::step_clock::now();
        stats_ = {};
        const int last_rank = topo_.config.rank_of_stage(last_stage());
        value_type result = std::numeric_limits<value_type>::quiet_NaN();
        walk<Labels>("a pipeline step", &table_, x, labels, std::move(problem), true, loss, stats_,
                     [&](auto& w, auto&) {
                         if (stage() == last_rank)
                             result = w.loss_sum();
                     });
        if (options_.output_broadcast)
            bcast(topo_.pp, std::span(&result, 1), last_rank);
        stats_.seconds = detail::seconds_since(t0);
        return result;
    }

    /// The forward passes of predict, the output sent to every stage when `broadcast`.
    std::optional<X> run_predict(const X* x, std::optional<std::string> problem, bool broadcast) {
        std::vector<X> outputs;
        std::size_t blocks = 0;
        detail::no_loss none;
        step_stats stats;
        walk<X>("a pipelined prediction", nullptr, x, nullptr, std::move(problem), false, none,
                stats, [&](auto& w, auto& batch) {
                    outputs = w.take_outputs();
                    blocks = std::size_t(batch.cut.row_blocks);
                });
        const int last_rank = topo_.config.rank_of_stage(last_stage());
        std::optional<X> out;
        agreed_alike(world_, [&] {
            if (stage() == last_rank)
                out = join_micro_batches(rows_joinable(std::move(outputs), blocks), blocks);
        });
        if (broadcast)
            broadcast_output(out, last_rank);
        return out;
    }

    /// Walks this rank's row of `table` (see the file comment; null: the forward passes of
    /// the batch's micro-batches, make_forward_schedule) on the batch `x` (first stage) and
    /// `labels` (last stage, when `labelled`), with `loss`: the batch is agreed on and cut,
    /// the row walked, then the ranks agree on its outcome, raising its error on every rank;
    /// then `done(walk, batch)`.
    template <distributed_tensor Labels, class Loss, class Done>
    void walk(const char* what, const schedule* table, const X* x, const Labels* labels,
              std::optional<std::string> problem, bool labelled, Loss& loss, step_stats& stats,
              Done&& done) {
        xshard::detail::open_scope(world_, what);
        const auto abandoned = xshard::detail::watch().abandoned;
        const int me = topo_.pp.rank(), last_rank = topo_.config.rank_of_stage(last_stage());
        auto batch = detail::make_step_batch(world_, topo_.mesh, me == 0, me == last_rank,
                                             topo_.config.micro_batches, x, labels,
                                             std::move(problem), labelled);
        schedule forward;
        if (!table) {
            auto c = topo_.config;
            c.micro_batches = batch.micro_batches; // at most the step's: the tags stay unique
            forward = make_forward_schedule(c);
            table = &forward;
        }
        const auto& mine = table->ranks[std::size_t(me)];
        detail::step_transfers<X> transfers(topo_, mine);
        const auto& stage = topo_.mesh.comm();
        detail::step_walk<X, Labels, Loss> w(stage, stage_layers_, last_stage(), batch, loss,
                                             transfers, stats);
        const auto failure = w.run(mine);
        using xshard::detail::scope_announced, xshard::detail::scope_failed;
        const char outcome = !failure         ? 0
                             : w.first_hand() ? char(scope_failed | scope_announced)
                                              : char(scope_failed);
        auto fail = [](int, const std::string& text, std::exception_ptr) {
            throw error(text);
        };
        xshard::detail::close_scope(world_, abandoned, outcome, w.origin(), failure.value_or(""),
                                    nullptr, fail, stage);
        done(w, batch);
    }

    /// `outputs`, each with its rows gathered whole where they are split otherwise than the
    /// batch's `blocks` (a compiled program splits them over every axis of the dataset), so
    /// that they join (join_micro_batches). Collective over the stage mesh.
    static std::vector<X> rows_joinable(std::vector<X> outputs, std::size_t blocks) {
        for (auto& o : outputs) {
            const auto split = std::size_t(o.layout().split_count(0, o.mesh().shape()));
            if (split == blocks || split == 1)
                continue;
            layout whole = o.layout();
            whole.dims[0] = {};
            o = redistribute<X::static_layout>(o, whole);
        }
        return outputs;
    }

    /// Sends `out` (the output, on the last stage's ranks) to the corresponding ranks of the
    /// other stages, or through a cross-mesh plan to those whose mesh differs; the others
    /// receive it into `out`. All transfers are to or from the last stage, after the walk's
    /// (every one of which is matched by then), so tag 0 is free.
    void broadcast_output(std::optional<X>& out, int last_rank) {
        const int me = stage();
        const int p = topo_.pp.size();
        const auto same_mesh = [&](int r) {
            return topo_.shapes[std::size_t(r)] == topo_.shapes[std::size_t(last_rank)];
        };
        if (me == last_rank) {
            std::list<outgoing<X>> plain;
            std::list<cross_outgoing<X>> cross;
            for (int r = 0; r < p; ++r) {
                if (r == me)
                    continue;
                if (same_mesh(r))
                    plain.emplace_back(topo_.pp, *out, r, 0);
                else
                    cross.emplace_back(topo_.cross, *out, topo_.placed[std::size_t(me)],
                                       topo_.placed[std::size_t(r)], out->layout(), 0);
            }
            for (auto& o : plain)
                o.wait();
            for (auto& o : cross)
                o.wait();
        } else if (same_mesh(me)) {
            incoming<X> in(topo_.pp, topo_.mesh, last_rank, 0);
            out = in.take();
        } else {
            cross_incoming<X> in(
                topo_.cross, topo_.mesh, topo_.placed[std::size_t(last_rank)],
                topo_.placed[std::size_t(me)], [](const layout& sent) { return sent; }, 0);
            out = in.take();
        }
    }

    /// The last (virtual) stage.
    int last_stage() const noexcept { return topo_.config.total_stages() - 1; }

public:
    /// PipelineGradReducer: sums this rank's weight gradients over their data-parallel copies
    /// on the stage mesh (fused buckets, see train/gradients.hpp), once per step after
    /// `step`; with `mean`, averages instead. Planned at every call: a kept
    /// gradient_synchronizer would hold the gradients' storage, which the backward passes'
    /// accumulation reallocates. Collective over the stage mesh.
    void synchronize_gradients(const gradient_options& o = {}) {
        xshard::synchronize_gradients(local_, grads_, o);
    }

    /// Sets this rank's weight gradients to zero terms.
    void zero_grad() {
        for_each_weight(local_, [](const std::string&, auto& w) { w.zero_grad(); });
    }

    /// This rank's part of the model (its stages' modules, named as in the model): a
    /// parameter container for optimizers, norms, checkpoints of the stage.
    detail::stage_view<Model>& local_parameters() noexcept { return local_; }

    /// The (virtual) stage of each module of the chain, in chain order, with its name.
    std::vector<std::pair<std::string, int>> stages() const {
        std::vector<std::pair<std::string, int>> out;
        for (std::size_t i = 0; i < modules_.size(); ++i)
            out.emplace_back(modules_[i]->name, stage_of_[i]);
        return out;
    }

    /// The names of the modules this rank runs.
    const std::set<std::string>& local_modules() const noexcept { return local_names_; }
    /// The model (every module, on this rank's stage mesh).
    Model& model() noexcept { return *model_; }
    /// The communicator of the whole mesh.
    const communicator& comm() const noexcept { return world_; }

    /// This rank's stage (its position along the pipeline axis).
    int stage() const noexcept { return topo_.pp.rank(); }
    /// The schedule's configuration and table, and what `analyze` predicts of it.
    const schedule_config& config() const noexcept { return topo_.config; }
    const schedule& table() const noexcept { return table_; }
    const schedule_report& predicted() const noexcept { return predicted_; }
    /// What the last step measured on this rank.
    const step_stats& last_step() const noexcept { return stats_; }

private:
    /// The schedule table of the configuration, and what `analyze` predicts of it; throws
    /// when the table is unsound or needs more message tags than MPI guarantees.
    void make_table() {
        const auto& c = topo_.config;
        table_ = make_schedule(c);
        const auto report = analyze(table_);
        if (!report.deadlock_free)
            throw error("xshard: pipeline: the schedule table is unsound: " + report.problem);
        predicted_ = report;
        if (2 * std::int64_t(c.total_stages()) * c.micro_batches * 2 > 32767)
            throw error("xshard: pipeline: " + std::to_string(c.total_stages()) +
                        " virtual stages x " + std::to_string(c.micro_batches) +
                        " micro-batches need more message tags than MPI guarantees "
                        "(at most 8191 pairs)");
    }

    /// The chain's modules, in the order the model lists them.
    void collect() {
        visit_parameters(*model_, [&](std::string_view name, auto& child) {
            using L = std::remove_cvref_t<decltype(child)>;
            static_assert(layer_of<L, X>,
                          "xshard: every module of a pipelined model must be a copyable layer "
                          "with forward(x) and backward(dy) on the pipeline's tensor type");
            auto m = std::make_unique<detail::chain_layer<L, X>>(child);
            m->name = std::string(name);
            for_each_parameter(child, [&](const std::string&, const auto& t) {
                m->cost += double(volume(t.shape()));
            });
            modules_.push_back(std::move(m));
        });
    }

    /// Stage per module, and each stage's modules.
    void assign() {
        std::vector<std::string> names;
        std::vector<double> cost;
        for (const auto& m : modules_) {
            names.push_back(m->name);
            cost.push_back(m->cost);
        }
        const int stages = topo_.config.total_stages();
        if (!options_.stage_config.empty() && !options_.stage_starts.empty())
            throw error("xshard: pipeline: give stage_config or stage_starts, not both");
        if (!options_.stage_config.empty())
            stage_of_ = stages_by_name(names, options_.stage_config, stages);
        else if (!options_.stage_starts.empty())
            stage_of_ = stages_by_position(names, options_.stage_starts, stages);
        else
            stage_of_ = stages_by_cost(names, cost, stages);
        stage_layers_.assign(std::size_t(stages), {});
        for (std::size_t i = 0; i < modules_.size(); ++i)
            stage_layers_[std::size_t(stage_of_[i])].push_back(modules_[i].get());
    }

    pipeline_options options_;
    communicator world_;
    detail::stage_topology<stage_mesh_type> topo_;
    Model* model_;
    schedule table_;
    schedule_report predicted_;
    std::vector<std::unique_ptr<detail::chain_module<X>>> modules_;
    std::vector<int> stage_of_;
    std::vector<std::vector<detail::chain_module<X>*>> stage_layers_;
    std::set<std::string> local_names_;
    detail::stage_view<Model> local_{model_, &local_names_};
    gradients_of<detail::stage_view<Model>> grads_{local_};
    step_stats stats_;
};

} // namespace xshard::pipeline
