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
/// A step splits the batch into m micro-batches (micro_batch.hpp) and runs this rank's row
/// of the schedule table (schedule.hpp): forward passes keep their activations in a slot
/// per micro-batch in flight (chain.hpp: a copy of the stage's layers without weights, the
/// weights lent in for each pass by a few pointer swaps), the last stage
/// computes the loss of each micro-batch and its gradient at once (scaled by the
/// micro-batch's share of the rows, so the step's loss and gradients are the whole batch's
/// mean), backward passes add into the weights' gradients, and activations and gradients
/// travel between corresponding ranks of neighbouring stages without blocking
/// (transfer.hpp). `synchronize_gradients()` (PipelineGradReducer) then sums them over each
/// stage's data-parallel copies once per step.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/pipeline/analysis.hpp>
#include <xshard/pipeline/boundary.hpp>
#include <xshard/pipeline/chain.hpp>
#include <xshard/pipeline/micro_batch.hpp>
#include <xshard/pipeline/schedule.hpp>
#include <xshard/pipeline/stages.hpp>
#include <xshard/pipeline/transfer.hpp>
#include <xshard/train/gradients.hpp>

#include <chrono>
#include <cmath>
#include <concepts>
#include <functional>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
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
    /// Module name -> (virtual) stage; names not given take the stage of the module before.
    std::map<std::string, int> stage_config = {};
    /// Or by position: the index of the first module of stages 1, 2, ...
    std::vector<std::size_t> stage_starts = {};
    /// Whether every stage learns the loss (a broadcast over the pipeline axis), not only the
    /// last.
    bool output_broadcast = false;
    /// (Virtual) stage -> the layout that stage receives its input activations in, on its
    /// own stage mesh; a stage not named receives them in the notation they were sent in.
    /// Where a stage's layout or mesh shape differs from its predecessor's, the transfer is a
    /// cross-mesh redistribution (boundary.hpp).
    std::map<int, layout> stage_input_layouts = {};
};

/// What the last step measured on this rank.
struct step_stats {
    double seconds = 0;      ///< the step, from its start to its last transfer delivered
    double busy_seconds = 0; ///< computing (forward, backward, loss)
    int peak_in_flight = 0;  ///< micro-batches whose activations were kept at once
    /// The idle share of the step (waiting for transfers or for neighbours).
    double bubble() const { return seconds > 0 ? 1.0 - busy_seconds / seconds : 0.0; }
};

namespace detail {

/// The modules of this rank's stages, as a parameter container (names as in the model).
template <class Model>
struct stage_view {
    Model* model;
    const std::set<std::string>* local;
    friend void visit_parameters(stage_view& v, auto&& visit) {
        visit_parameters(*v.model, [&](std::string_view name, auto& child) {
            if (v.local->count(std::string(name)))
                visit(name, child);
        });
    }
    friend void visit_parameters(const stage_view& v, auto&& visit) {
        visit_parameters(*v.model, [&](std::string_view name, auto& child) {
            if (v.local->count(std::string(name)))
                visit(name, child);
        });
    }
};

} // namespace detail

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
        , stage_mesh_(stage_mesh)
        , model_(&model) {
        std::optional<std::string> problem;
        try {
            const std::size_t a = mesh.shape().index(axis);
            axis_ = a;
            pp_ = mesh.sub(axis_set::of(a)).dup();
            config_ = {options_.scheduler, mesh.axis_size(a), options_.micro_batches,
                       options_.virtual_stages};
            if (stage_mesh.size() * pp_.size() != mesh.size())
                throw error("xshard: pipeline: the stage mesh has " +
                            std::to_string(stage_mesh.size()) + " ranks, but " +
                            std::to_string(mesh.size()) + " ranks over " +
                            std::to_string(pp_.size()) + " stages need " +
                            std::to_string(mesh.size() / pp_.size()) + " per stage");
            table_ = make_schedule(config_);
            const auto report = analyze(table_);
            if (!report.deadlock_free)
                throw error("xshard: pipeline: the schedule table is unsound: " + report.problem);
            predicted_ = report;
            if (2 * std::int64_t(config_.total_stages()) * config_.micro_batches * 2 > 32767)
                throw error("xshard: pipeline: " + std::to_string(config_.total_stages()) +
                            " virtual stages x " + std::to_string(config_.micro_batches) +
                            " micro-batches need more message tags than MPI guarantees "
                            "(at most 8191 pairs)");
            collect();
            assign();
        } catch (const std::exception& e) {
            problem = e.what();
        }
        agree_on_error(world_, problem);
        learn_stage_meshes(mesh, stage_mesh);
        const int me = pp_.rank();
        for (std::size_t i = 0; i < modules_.size(); ++i)
            if (config_.rank_of_stage(stage_of_[i]) == me)
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
    /// of the batch (zero_grad() before the next step). Besides the transfers, one
    /// all-reduce of an int over the mesh (that agreement).
    template <distributed_tensor Labels, class Loss>
    value_type step(const X& x, const Labels& labels, Loss& loss) {
        std::optional<std::string> problem;
        if (!(x.mesh() == stage_mesh_) || !(labels.mesh() == stage_mesh_))
            problem = "xshard: pipeline: the batch and the labels must live on the pipeline's "
                      "stage mesh (" +
                      stage_mesh_.shape().to_string() + ")";
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
    bool reads_inputs() const noexcept { return pp_.rank() == 0; }
    bool reads_labels() const noexcept {
        return pp_.rank() == config_.rank_of_stage(config_.total_stages() - 1);
    }

private:
    /// The step on `x` (read on the first stage only) and `labels` (the last stage only).
    template <distributed_tensor Labels, class Loss>
    value_type run_step(const X* x, const Labels* labels, Loss& loss,
                        std::optional<std::string> problem) {
        const auto t0 = clock::now();
        stats_ = {};
        std::vector<X> xs;
        std::vector<Labels> ys;
        std::vector<std::size_t> rows;
        const int me = pp_.rank(), last_rank = config_.rank_of_stage(config_.total_stages() - 1);
        // The first stage cuts the batch, the last its labels: both must cut the same rows
        // (as many in as many row blocks), which the ranks check together.
        std::array<long long, 4> cut{0, 0, 0, 0};
        try {
            if (!problem && me == 0) {
                if (!x || !(x->mesh() == stage_mesh_))
                    throw error("xshard: pipeline: the first stage needs the batch, on its stage "
                                "mesh (" +
                                stage_mesh_.shape().to_string() + ")");
                cut[0] = (long long)x->shape()[0];
                cut[1] = x->layout().split_count(0, stage_mesh_.shape());
            }
            if (!problem && me == last_rank) {
                if (!labels || !(labels->mesh() == stage_mesh_))
                    throw error("xshard: pipeline: the last stage needs the labels, on its stage "
                                "mesh (" +
                                stage_mesh_.shape().to_string() + ")");
                cut[2] = (long long)labels->shape()[0];
                cut[3] = labels->layout().split_count(0, stage_mesh_.shape());
            }
        } catch (const std::exception& e) {
            problem = e.what();
        }
        agree_on_error(world_, problem);
        mpi::allreduce(world_, std::span(cut), reduction::max);
        // Every rank sees the same numbers, so every rank throws alike.
        const long long blocks = std::max(cut[1], cut[3]);
        if (cut[0] != cut[2] || blocks % cut[1] != 0 || blocks % cut[3] != 0)
            throw error("xshard: pipeline: the first stage splits a batch of " +
                        std::to_string(cut[0]) + " rows into " + std::to_string(cut[1]) +
                        " row blocks, the last stage " + std::to_string(cut[2]) + " labels into " +
                        std::to_string(cut[3]) +
                        ": micro-batches need as many rows, and block counts of which one "
                        "divides the other");
        try {
            if (me == 0)
                xs = split_micro_batches(*x, config_.micro_batches, std::size_t(blocks));
            if (me == last_rank) {
                rows = micro_batch_rows(std::size_t(cut[2]), std::size_t(blocks),
                                        config_.micro_batches);
                ys = split_micro_batches(*labels, config_.micro_batches, std::size_t(blocks));
            }
        } catch (const std::exception& e) {
            problem = e.what();
        }
        agree_on_error(world_, problem);

        const int last = config_.total_stages() - 1;
        const auto& mine = table_.ranks[std::size_t(me)];
        const double total_rows = double(cut[2]);
        std::map<int, std::unique_ptr<incoming<X>>> inbox;
        std::map<int, std::unique_ptr<cross_incoming<X>>> cross_inbox;
        std::map<int, X> local_box; // hand-overs between virtual stages of this rank
        std::list<outgoing<X>> outbox;
        std::list<cross_outgoing<X>> cross_outbox;
        // The layouts of the boundary tensors sent forward across cross-mesh boundaries,
        // per (stage, micro-batch): what stage s sent on, and what it received; a gradient
        // goes back to their dual (see boundary.hpp).
        std::map<std::pair<int, int>, layout> sent_layout, received_layout;
        // (A missing record means the step is aborting: any layout does then.)
        const auto gradient_layout = [&](const std::map<std::pair<int, int>, layout>& records,
                                         int stage, int mb, int to_rank) {
            const auto it = records.find({stage, mb});
            const auto& shape = stage_shapes_[std::size_t(to_rank)];
            return it == records.end() ? layout::replicated(X::rank) : dual(it->second, shape);
        };
        for (const auto& a : mine) {
            if (a.recv_from < 0 || a.recv_from == me)
                continue;
            const bool fwd = a.kind == pass::forward;
            if (cross_boundary(fwd ? a.stage : a.stage + 1)) {
                typename cross_incoming<X>::layout_rule rule;
                if (fwd)
                    rule = [this, s = a.stage](const layout& sent) {
                        return input_layout(s, sent);
                    };
                else
                    rule = [&, s = a.stage, mb = a.micro_batch](const layout&) {
                        return gradient_layout(sent_layout, s, mb, me);
                    };
                cross_inbox.emplace(tag(a),
                                    std::make_unique<cross_incoming<X>>(
                                        cross_, stage_mesh_, placed_[std::size_t(a.recv_from)],
                                        placed_[std::size_t(me)], std::move(rule), tag(a)));
            } else {
                inbox.emplace(tag(a),
                              std::make_unique<incoming<X>>(pp_, stage_mesh_, a.recv_from, tag(a)));
            }
        }
        std::map<int, X> output_grad; // last stage: the loss gradient per micro-batch
        std::map<std::pair<int, int>, std::size_t> slot_of; // (stage, micro-batch) -> slot
        std::map<int, std::vector<std::size_t>> free_slots; // per stage
        std::map<int, std::size_t> slot_count;
        int in_flight = 0;
        value_type loss_sum = 0;

        const auto input_of = [&](const action& a) -> X {
            if (a.recv_from == me) {
                auto node = local_box.extract(tag(a));
                return std::move(node.mapped());
            }
            if (auto c = cross_inbox.extract(tag(a))) {
                auto t = c.mapped()->take();
                if (!t)
                    throw peer_aborted{c.mapped()->aborted()};
                if (a.kind == pass::forward)
                    received_layout[{a.stage, a.micro_batch}] = c.mapped()->source_layout();
                return std::move(*t);
            }
            auto node = inbox.extract(tag(a));
            auto t = node.mapped()->take();
            if (!t)
                throw peer_aborted{node.mapped()->aborted()};
            return std::move(*t);
        };
        const auto send = [&](const action& a, X t) {
            const int to_tag = send_tag(a);
            const bool fwd = a.kind == pass::forward;
            if (a.send_to == me) {
                local_box.emplace(to_tag, std::move(t));
            } else if (cross_boundary(fwd ? a.stage + 1 : a.stage)) {
                const auto& from = placed_[std::size_t(me)];
                const auto& to = placed_[std::size_t(a.send_to)];
                if (fwd) {
                    sent_layout[{a.stage, a.micro_batch}] = t.layout();
                    const auto l = input_layout(a.stage + 1, t.layout());
                    cross_outbox.emplace_back(cross_, std::move(t), from, to, l, to_tag);
                } else {
                    const auto l =
                        gradient_layout(received_layout, a.stage, a.micro_batch, a.send_to);
                    cross_outbox.emplace_back(cross_, std::move(t), from, to, l, to_tag);
                }
            } else {
                outbox.emplace_back(pp_, std::move(t), a.send_to, to_tag);
            }
        };
        const auto timed = [&](auto&& f) {
            const auto s = clock::now();
            f();
            stats_.busy_seconds += seconds(clock::now() - s);
        };

        // A failure (this rank's, or an aborted sender's) stops the actions; the transfers
        // still owed go out as aborts and the expected ones are drained (transfer.hpp), then
        // every rank raises the error.
        std::optional<std::string> failure;
        std::size_t stopped = mine.size();
        for (std::size_t i = 0; i < mine.size() && !failure; ++i) {
            const auto& a = mine[i];
            try {
                const auto& layers = stage_layers_[a.stage];
                if (a.kind == pass::forward) {
                    X h = a.stage == 0 ? std::move(xs[std::size_t(a.micro_batch)]) : input_of(a);
                    auto& pool = free_slots[a.stage];
                    std::size_t slot;
                    if (pool.empty()) {
                        slot = slot_count[a.stage]++;
                    } else {
                        slot = pool.back();
                        pool.pop_back();
                    }
                    slot_of[{a.stage, a.micro_batch}] = slot;
                    stats_.peak_in_flight = std::max(stats_.peak_in_flight, ++in_flight);
                    timed([&] {
                        for (auto* l : layers)
                            h = l->forward(slot, h);
                        if (a.stage == last) {
                            const auto& y = ys[std::size_t(a.micro_batch)];
                            const value_type share =
                                value_type(double(rows[std::size_t(a.micro_batch)]) / total_rows);
                            loss_sum += share * value_type(loss.forward(h, y));
                            output_grad.emplace(a.micro_batch, X(loss.backward(share)));
                        }
                    });
                    if (a.stage != last)
                        send(a, std::move(h));
                } else if (a.kind == pass::backward_weight) {
                    const auto slot = slot_of.at({a.stage, a.micro_batch});
                    timed([&] {
                        for (auto it = layers.rbegin(); it != layers.rend(); ++it)
                            (*it)->backward_weight(slot);
                    });
                    release(a, slot_of, free_slots, in_flight);
                } else {
                    X g = [&] {
                        if (a.stage != last)
                            return input_of(a);
                        auto node = output_grad.extract(a.micro_batch);
                        return std::move(node.mapped());
                    }();
                    const auto slot = slot_of.at({a.stage, a.micro_batch});
                    const bool split = a.kind == pass::backward_input;
                    timed([&] {
                        for (auto it = layers.rbegin(); it != layers.rend(); ++it)
                            g = split ? (*it)->backward_input(slot, g) : (*it)->backward(slot, g);
                    });
                    if (!split)
                        release(a, slot_of, free_slots, in_flight);
                    if (a.stage != 0)
                        send(a, std::move(g));
                }
            } catch (const peer_aborted& e) {
                failure = e.message;
                stopped = i;
            } catch (const std::exception& e) {
                failure = e.what();
                stopped = i;
            }
            for (auto& [t, in] : inbox)
                in->poll();
            for (auto& [t, in] : cross_inbox)
                in->poll();
            outbox.remove_if([](auto& o) { return o.done(); });
            cross_outbox.remove_if([](auto& o) { return o.done(); });
        }
        if (failure) {
            for (std::size_t i = stopped; i < mine.size(); ++i) {
                const auto& a = mine[i];
                if (a.send_to < 0 || a.send_to == me)
                    continue;
                if (cross_boundary(a.kind == pass::forward ? a.stage + 1 : a.stage))
                    cross_outbox.emplace_back(cross_, *failure, placed_[std::size_t(a.send_to)],
                                              send_tag(a));
                else
                    outbox.emplace_back(pp_, *failure, a.send_to, send_tag(a));
            }
            for (auto& [t, in] : inbox)
                in->take();
            for (auto& [t, in] : cross_inbox)
                in->take();
        }
        for (auto& o : outbox)
            o.wait();
        for (auto& o : cross_outbox)
            o.wait();
        agree_on_error(world_, failure);

        value_type result =
            me == last_rank ? loss_sum : std::numeric_limits<value_type>::quiet_NaN();
        if (options_.output_broadcast)
            bcast(pp_, std::span(&result, 1), last_rank);
        stats_.seconds = seconds(clock::now() - t0);
        return result;
    }

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
    int stage() const noexcept { return pp_.rank(); }
    /// The schedule's configuration and table, and what `analyze` predicts of it.
    const schedule_config& config() const noexcept { return config_; }
    const schedule& table() const noexcept { return table_; }
    const schedule_report& predicted() const noexcept { return predicted_; }
    /// What the last step measured on this rank.
    const step_stats& last_step() const noexcept { return stats_; }

private:
    /// Every stage's mesh shape (stages may factor their ranks differently; each rank knows
    /// only its own), its placement on the mesh's ranks, and the checks of the declared
    /// input layouts. Collective: one all-gather of the shapes, one agreement.
    template <mesh_type FullMesh>
    void learn_stage_meshes(const FullMesh& mesh, const stage_mesh_type& stage_mesh) {
        constexpr std::size_t nd = stage_mesh_type::ndim;
        std::vector<int> mine(nd), all(nd * std::size_t(world_.size()));
        for (std::size_t i = 0; i < nd; ++i)
            mine[i] = stage_mesh.shape().sizes[i];
        mpi::allgather(world_, mine, all);
        std::optional<std::string> problem;
        try {
            const int p = pp_.size();
            stage_shapes_.assign(std::size_t(p), {});
            std::vector<bool> seen(std::size_t(p), false);
            for (int r = 0; r < world_.size(); ++r) {
                const int s = mesh.shape().coords(r)[axis_];
                mesh_shape shape = stage_mesh.shape();
                for (std::size_t i = 0; i < nd; ++i)
                    shape.sizes[i] = all[std::size_t(r) * nd + i];
                if (!seen[std::size_t(s)]) {
                    stage_shapes_[std::size_t(s)] = shape;
                    seen[std::size_t(s)] = true;
                } else if (!(stage_shapes_[std::size_t(s)] == shape)) {
                    throw error("xshard: pipeline: the ranks of stage " + std::to_string(s) +
                                " disagree on its stage mesh (mesh(" +
                                stage_shapes_[std::size_t(s)].to_string() + ") and mesh(" +
                                shape.to_string() + "))");
                }
            }
            for (int s = 0; s < p; ++s)
                placed_.push_back(
                    placed_mesh::slice_of(mesh.shape(), axis_, s, stage_shapes_[std::size_t(s)]));
            if (placed_[std::size_t(pp_.rank())].mesh_rank_of(world_.rank()) != stage_mesh.rank())
                throw error("xshard: pipeline: the stage mesh numbers its ranks otherwise than the "
                            "mesh's other axes (make it over stage_mesh_of's communicator)");
            for (const auto& [s, l] : options_.stage_input_layouts) {
                if (s < 1 || s >= config_.total_stages())
                    throw error("xshard: pipeline: stage_input_layouts names stage " +
                                std::to_string(s) + "; stages 1 to " +
                                std::to_string(config_.total_stages() - 1) + " receive inputs");
                const auto& shape = stage_shapes_[std::size_t(config_.rank_of_stage(s))];
                switch (check_boundary_layout(l, X::rank, shape.names)) {
                case boundary_problem::none:
                    break;
                case boundary_problem::wrong_rank:
                    throw error("xshard: pipeline: the input layout " + l.to_string() +
                                " of stage " + std::to_string(s) + " is not for a tensor of rank " +
                                std::to_string(X::rank));
                case boundary_problem::bad_layout:
                    throw error("xshard: pipeline: the input layout " + l.to_string() +
                                " of stage " + std::to_string(s) + " does not fit its mesh(" +
                                shape.to_string() + ")");
                case boundary_problem::partial_input:
                    throw error("xshard: pipeline: the input layout " + l.to_string() +
                                " of stage " + std::to_string(s) + " has a pending reduction");
                }
            }
        } catch (const std::exception& e) {
            problem = e.what();
        }
        agree_on_error(world_, problem);
        cross_ = world_.dup();
    }

    /// Whether the boundary into (virtual) stage `s` (from s - 1) is a cross-mesh transfer.
    bool cross_boundary(int s) const {
        const auto a = std::size_t(config_.rank_of_stage(s - 1)),
                   b = std::size_t(config_.rank_of_stage(s));
        return !(stage_shapes_[a] == stage_shapes_[b]) || options_.stage_input_layouts.count(s);
    }

    /// The layout stage `s` receives its input in, when it was sent as `sent`.
    layout input_layout(int s, const layout& sent) const {
        const auto it = options_.stage_input_layouts.find(s);
        return it != options_.stage_input_layouts.end() ? it->second : sent;
    }

    using clock = std::chrono::steady_clock;
    static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }

    /// An aborted sender's error, seen by a receiver.
    struct peer_aborted {
        std::string message;
    };

    /// The tag of the transfer that action `a` sends.
    int send_tag(const action& a) const {
        return tag_of(a.kind == pass::forward ? 0 : 1, a.micro_batch,
                      a.kind == pass::forward ? a.stage + 1 : a.stage - 1);
    }
    /// The tag of the transfer that action `a` receives.
    int tag(const action& a) const {
        return tag_of(a.kind == pass::forward ? 0 : 1, a.micro_batch, a.stage);
    }
    /// Tags of the transfer into (stage, micro-batch): direction 0 activations, 1 gradients;
    /// the header on the even tag, the block on the next.
    int tag_of(int direction, int mb, int stage) const {
        return ((stage * config_.micro_batches + mb) * 2 + direction) * 2;
    }

    void release(const action& a, std::map<std::pair<int, int>, std::size_t>& slot_of,
                 std::map<int, std::vector<std::size_t>>& free_slots, int& in_flight) {
        const auto node = slot_of.extract({a.stage, a.micro_batch});
        free_slots[a.stage].push_back(node.mapped());
        --in_flight;
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
        const int stages = config_.total_stages();
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
    communicator world_, pp_, cross_;
    std::size_t axis_ = 0;
    std::vector<mesh_shape> stage_shapes_; ///< per pipeline rank
    std::vector<placed_mesh> placed_;      ///< per pipeline rank, on world_'s ranks
    stage_mesh_type stage_mesh_;
    Model* model_;
    schedule_config config_;
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

/// The stage mesh of `mesh` without axis `axis`: a `mesh<Others...>` over this rank's
/// sub-communicator of the other axes, with their sizes. `StageMesh` names the other axes
/// in order. Collective over the mesh.
template <mesh_type StageMesh, mesh_type FullMesh>
StageMesh stage_mesh_of(const FullMesh& mesh) {
    std::array<int, StageMesh::ndim> sizes{};
    axis_set others{};
    for (std::size_t i = 0; i < StageMesh::ndim; ++i) {
        const std::size_t a = mesh.shape().index(StageMesh::axis_names[i].view());
        sizes[i] = mesh.axis_size(a);
        others = others | axis_set::of(a);
    }
    return StageMesh(mesh.sub(others), sizes);
}

} // namespace xshard::pipeline
