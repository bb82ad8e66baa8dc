#pragma once
/// \file
/// The training driver `xshard::trainer`, MindSpore's `Model(network, loss_fn,
/// optimizer).train(epoch, train_dataset, callbacks)`, `Model.eval(valid_dataset)` and
/// `Model.predict(x)`, over an
/// `auto_parallel` configuration (driver/auto_parallel.hpp), with the callbacks of
/// driver/callbacks.hpp. `xshard::model` is another name for it, after MindSpore's `Model`:
///
///     xshard::auto_parallel net(model, mesh);
///     net.hsdp();
///     xshard::trainer driver(net, loss, optimizer);
///     driver.train(2, loader, {xshard::callbacks::loss_monitor(1),
///                              xshard::callbacks::model_checkpoint({.save_checkpoint_steps = 4,
///                                                                   .directory = "ckpt"})});
///     const auto metrics = driver.eval(held_out);        // loss and accuracy
///
/// Each step is the manual loop's: forward, loss, backward, gradient synchronisation as
/// configured (xshard::hsdp when hsdp() was called; else the configuration's gradient_path,
/// driver/gradient_path.hpp: a kept gradient_synchronizer with the configured mean, fp32
/// communication and fusion, or the sharded update, hsdp level2, where it prices lower), the
/// local norms when configured, the optimizer step (on the shards, then the all-gather, under
/// hsdp), zero_grad. The driver adds no collective of its own to a step.
///
/// hsdp optimizer_level level3 (ZeRO-3): the passes run through `hsdp::forward` and
/// `hsdp::backward` (each layer's weights gathered just before use, the next one's
/// prefetched, freed after; each layer's gradient reduce-scattered into the shards as soon as
/// its backward is done), and the weights' values hold no storage between steps. `train`
/// returns with the weights gathered (readable and saveable until the next step frees them),
/// `eval` gathers them once before its batches, a checkpoint save or load gathers them first
/// (one all-gather each); a level3 checkpoint is an ordinary integrated one (loads at any
/// level, mesh or world size, and any loads at level3). Under pipeline stages each stage's
/// weights are sharded over that stage's data-parallel ranks, gathered once per step before
/// the stage's first micro-batch (hsdp::begin_passes) and freed after its last backward,
/// whose accumulated gradients are then reduce-scattered into the shards (hsdp::end_passes).
///
/// A dataset strategy of layouts or strategies (auto_parallel::dataset_strategy with a tuple)
/// lays the batch out: each distributed tensor of (x, y) in another layout than the
/// strategy's for it is redistributed into it before the step or evaluation. A loader given
/// the same layouts (`data::loader_options::layouts = net.input_layouts()`) reads them so and
/// nothing moves. A tensor whose layout is a type, and differs, raises on every rank.
///
/// disable_loss_repeated_mean(): the backward seed (the loss gradient) is scaled by the
/// configuration's `loss_repetitions()` r (the ranks that compute the loss of the same rows:
/// tp on a (dp, tp) mesh under data_parallel; 1 under pure data parallelism), so every
/// gradient is r times the default's, as MindSpore's without the loss repeated mean.
///
/// With `pipeline(stages > 1)` the configuration's mesh holds the stages on an axis
/// (`trainer_options::pipeline_axis`, "pp", of size `stages`) and the model lives on the stage
/// mesh (the other axes, pipeline::stage_mesh_of). The driver then runs each step through
/// `xshard::pipeline::pipeline` (MindSpore's `Pipeline(net, micro_size, stage_config)`: the
/// micro-batches and stage_config of `trainer_options`), reduces the gradients over each
/// stage's data-parallel copies (PipelineGradReducer; under hsdp the stage's optimizer
/// sharding) and updates the stage's own parameters; the loss is broadcast over the
/// pipeline axis so that every rank's callbacks see it. `eval` and `predict` run through the
/// pipeline too, each stage with its own weights only. A program chain searched in
/// sharding_propagation or recursive_programming is cut with its modules balanced by the
/// seconds the search predicts for them (auto_parallel::searched_stage_starts), unless
/// stage_config is given.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/driver/auto_parallel.hpp>
#include <xshard/driver/callbacks.hpp>
#include <xshard/graph/executable.hpp>
#include <xshard/io/checkpoint.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/pipeline/checkpoint.hpp>
#include <xshard/pipeline/micro_batch.hpp>
#include <xshard/pipeline/pipeline.hpp>
#include <xshard/redistribute/redistribute.hpp>
#include <xshard/train/gradients.hpp>
#include <xshard/train/hsdp.hpp>

#include <xtensor/xsort.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

namespace xshard {

/// What `trainer::eval` measured: MindSpore's metrics {"loss", "accuracy"}.
struct eval_result {
    double loss = 0;         ///< mean loss over the samples
    double accuracy = 0;     ///< share of samples whose largest logit is their label's
    std::size_t samples = 0; ///< samples evaluated
};

/// The options of the driver that belong to MindSpore's `Pipeline(net, micro_size,
/// stage_config)` cell: used only with `pipeline(stages > 1)`.
struct trainer_options {
    /// Micro-batches per step (MindSpore's micro_size).
    int micro_batches = 1;
    /// Module path -> stage (MindSpore's stage_config: dotted paths at any depth, with or
    /// without the "_backbone." prefix; pipeline/stages.hpp); empty: balanced by parameters.
    std::map<std::string, int> stage_config = {};
    /// The mesh axis that holds the stages.
    std::string pipeline_axis = "pp";
    /// Gradient accumulation: each step runs K forward and backward passes, on K slices of
    /// every rank's rows of the batch (pipeline/micro_batch.hpp), each pass's loss and
    /// gradient weighed by its share of the rows, then one gradient reduction and one
    /// update: the step of the whole batch, in the memory of a K-th of it. Under hsdp level3
    /// the weights are gathered once around the K passes; under a pipeline the step runs
    /// K x micro_batches micro-batches. Layers whose forward pass depends on the whole batch
    /// (batch norm) see each slice alone.
    int gradient_accumulation = 1;
};

/// An auto_parallel configuration (driver/auto_parallel.hpp).
template <class P>
concept auto_parallel_configuration = requires(P& p) {
    p.compile();
    p.model();
    p.mesh();
    p.gradient_options();
    p.hsdp_config();
    p.gradient_path_config();
    p.machine();
};

namespace detail {

/// The samples among `logits` (rows x classes) whose largest logit is at their label, over
/// the mesh: the logits are laid out with their rows split like the labels' and their classes
/// whole (a redistribution; nothing when they are so already), each row is counted by one
/// rank of the ranks that hold it, and the counts are summed (one all-reduce of one integer).
template <distributed_tensor L, distributed_tensor Y>
std::int64_t correct_predictions(const L& logits, const Y& labels) {
    layout whole = logits.layout();
    whole.dims[0] = labels.layout().dims[0];
    whole.dims[1] = {};
    whole.partial = {};
    const auto rows = redistribute<dynamic_layout(2)>(logits, whole);
    const auto& mesh = rows.mesh();
    const auto& ms = mesh.shape();
    std::array<std::int64_t, 1> right{0};
    if (ms.group_rank(mesh.rank(), ms.all_axes() - whole.split_axes(0, ms)) == 0) {
        const auto& x = rows.local();
        const auto& y = labels.local();
        for (std::size_t i = 0; i < x.shape()[0]; ++i)
            right[0] +=
                std::int64_t(xt::argmax(xt::row(x, std::ptrdiff_t(i)))()) == std::int64_t(y(i));
    }
    allreduce(mesh.comm(), std::span(right), reduction::sum);
    return right[0];
}

} // namespace detail

/// The training driver (see the file comment), MindSpore's `Model`. `net`, `loss` and
/// `optimizer` must outlive it;
/// `loss` has `forward(prediction, labels) -> double` (the global loss) and `backward()`
/// (`backward(scale)` under a pipeline), the model `forward(x)` and `backward(dy)`.
/// Construction calls `net.compile()` (collective: raises on every rank for what is not
/// supported) and plans the gradient synchronisation.
template <auto_parallel_configuration Parallel, class Loss, class Optimizer>
class trainer {
public:
    using network_type = std::remove_cvref_t<decltype(std::declval<Parallel&>().model())>;
    /// Whether pipeline(stages > 1) can run the network: any model of layers; not a compiled
    /// program, whose nodes are not layers (an xshard::program_chain is one).
    static constexpr bool pipelinable = !detail::is_compiled_program<network_type>;

    trainer(Parallel& net, Loss& loss, Optimizer& optimizer, trainer_options options = {})
        : net_(&net)
        , loss_(&loss)
        , optimizer_(&optimizer)
        , options_(std::move(options))
        , grads_{net.model()} {
        const int stages = net.pipeline_settings().stages;
        std::optional<std::string> problem;
        if (options_.gradient_accumulation < 1)
            problem = "xshard: model: gradient_accumulation must be at least 1, not " +
                      std::to_string(options_.gradient_accumulation);
        else if (stages > 1 && detail::is_compiled_program<network_type>)
            problem = "xshard: model: pipeline(" + std::to_string(stages) +
                      ") is not supported for a compiled program: the pipeline cuts a chain of "
                      "layers; make the program an xshard::program_chain (its modules are "
                      "layers), or use pipeline(1)";
        else if (stages > 1) {
            const auto& ms = net.mesh().shape();
            std::size_t a = ms.ndim();
            for (std::size_t i = 0; i < ms.ndim(); ++i)
                if (ms.names[i].view() == options_.pipeline_axis)
                    a = i;
            if (a == ms.ndim())
                problem = "xshard: model: pipeline(" + std::to_string(stages) +
                          ") needs a mesh axis '" + options_.pipeline_axis +
                          "' for the stages; the mesh is " + ms.to_string();
            else if (ms.sizes[a] != stages)
                problem = "xshard: model: pipeline(" + std::to_string(stages) + ") on axis '" +
                          options_.pipeline_axis + "' of " + std::to_string(ms.sizes[a]) +
                          " ranks: the axis must have one rank per stage";
            else
                pipeline_axis_ = a;
        }
        agree_on_error(net.mesh().comm(), problem);
        net.compile();
        if (!net.loss_repeated_mean())
            seed_scale_ = net.loss_repetitions(options_.pipeline_axis);
        if (pipelined())
            return; // the pipeline is made at the first step, from the batch's type
        if (net.hsdp_config())
            sharding_ = net.make_hsdp();
        else if (shards_update(net.model(), net.gradient_path_config(), net.gradient_options(),
                               net.machine()))
            sharding_ = std::make_unique<xshard::hsdp<network_type>>(
                net.model(), sharded_update_options(net.machine()), net.gradient_options());
        else
            sync_.emplace(net.model(), grads_, net.gradient_options());
    }
    trainer(const trainer&) = delete;
    trainer& operator=(const trainer&) = delete;

    /// Whether steps run through a pipeline (pipeline(stages > 1)).
    bool pipelined() const noexcept { return net_->pipeline_settings().stages > 1; }

    /// Under a pipeline, after the first step (which makes it): the (virtual) stage of each
    /// module of the chain, in chain order, with its name. Empty otherwise.
    std::vector<std::pair<std::string, int>> pipeline_stages() const {
        return stage_ ? stage_->stages() : std::vector<std::pair<std::string, int>>{};
    }

    /// One training step on the batch (x, y); returns its loss. Collective over the mesh, and
    /// a failure scope (comm/agree.hpp): an exception on some ranks (a layer, the loss, the
    /// optimizer) raises on every rank, the others' `peer_failure` naming the failing rank,
    /// even when they wait in a collective it will not reach. The model is then part-way
    /// through the step: resume from a checkpoint.
    template <class X, class Y>
    double train_step(const X& x, const Y& y) {
        return agreed(net_->mesh().comm(), [&] {
            return in_dataset_layouts(
                x, y, [&](const auto& lx, const auto& ly) { return run_step(lx, ly); });
        });
    }

private:
    /// `f(x, y)` with each distributed tensor of the batch in the dataset strategy's layout
    /// for it (see the file comment): redistributed where it differs, else as it is.
    template <class X, class Y, class F>
    decltype(auto) in_dataset_layouts(const X& x, const Y& y, F&& f) const {
        const auto& wanted = net_->input_layouts();
        auto relaid = [&]<class D>(const D& d, std::size_t i) -> std::optional<D> {
            if constexpr (distributed_tensor<D>) {
                if (i >= wanted.size() || d.layout() == wanted[i])
                    return std::nullopt;
                if constexpr (D::static_layout.dynamic)
                    return redistribute<D::static_layout>(d, wanted[i]);
                else
                    throw error("xshard: model: the batch's tensor " + std::to_string(i) +
                                " has the layout " + d.layout().to_string() +
                                " in its type, not the dataset strategy's " +
                                wanted[i].to_string() + "; read it with the strategy's layouts");
            }
            return std::nullopt;
        };
        const auto rx = relaid(x, 0);
        const auto ry = relaid(y, 1);
        return f(rx ? *rx : x, ry ? *ry : y);
    }

    template <class X, class Y>
    double run_step(const X& x, const Y& y) {
        if constexpr (pipelinable) // (else refused by the constructor)
            if (pipelined())
                return pipeline_step(x, y);
        auto& net = net_->model();
        double l = 0;
        if (options_.gradient_accumulation > 1) {
            l = accumulate(x, y);
        } else if (level3()) {
            l = loss_->forward(sharding_->forward(x), y);
            sharding_->backward(loss_gradient());
        } else {
            l = loss_->forward(net.forward(x), y);
            net.backward(loss_gradient());
        }
        if (sharding_) {
            sharding_->synchronize_gradients();
            if (net_->local_norm_enabled()) {
                auto g = sharding_->gradients();
                net_->report_local_norms(g, long(steps_));
            }
            sharding_->step(*optimizer_);
        } else {
            sync_->synchronize();
            if (net_->local_norm_enabled())
                net_->report_local_norms(grads_, long(steps_));
            optimizer_->step(net);
        }
        for_each_weight(net, [](const std::string&, auto& w) { w.zero_grad(); });
        ++steps_;
        return l;
    }

public:
    /// Epochs `initial_epoch` .. `epochs` - 1 over `dataset` (MindSpore's initial_epoch, for
    /// a resumed run): an object with `epoch(e)` giving epoch e's batches (a data::loader),
    /// or a range of batches read again every epoch; each batch destructures into (x, y).
    /// Returns every step's loss. Collective over the mesh.
    template <class Dataset>
    std::vector<double> train(std::size_t epochs, Dataset&& dataset,
                              std::vector<callback> callbacks = {}, std::size_t initial_epoch = 0) {
        std::size_t steps_per_epoch = 0;
        if constexpr (requires { std::ranges::size(batches_of(dataset, 0)); })
            steps_per_epoch = std::size_t(std::ranges::size(batches_of(dataset, 0)));
        const train_begin_info begin{
            &net_->mesh().comm(),
            epochs,
            steps_per_epoch,
            {[this](const std::string& path, std::int64_t step, checkpoint_format format) {
                save_checkpoint(path, step, format);
            }}};
        for (auto& c : callbacks)
            if (c.on_train_begin)
                c.on_train_begin(begin);
        std::vector<double> losses;
        for (std::size_t e = initial_epoch; e < epochs; ++e) {
            std::size_t s = 0;
            for (auto&& batch : batches_of(dataset, e)) {
                auto&& [x, y] = batch;
                const double l = train_step(x, y);
                losses.push_back(l);
                const std::size_t samples = rows_of(x);
                for (auto& c : callbacks)
                    if (c.on_step)
                        c.on_step({e, s, l, samples, std::int64_t(steps_)});
                ++s;
            }
            for (auto& c : callbacks)
                if (c.on_epoch_end)
                    c.on_epoch_end(e);
        }
        gather_weights(); // the trained weights readable (and saveable)
        return losses;
    }

    /// MindSpore's Model.eval with metrics {"loss", "accuracy"}: the model's forward pass and
    /// the loss over every batch of `dataset` (its epoch 0 for a loader; batches of any size,
    /// uneven ones included), the loss averaged over the samples, the accuracy counted as in
    /// detail::correct_predictions. Under a pipeline each batch runs through it
    /// (pipeline::predict_on_last_stage): every stage runs only its own modules with its own
    /// weights, the last stage computes the metrics and broadcasts them over the pipeline
    /// axis; no weights move. At hsdp level3 the weights (the stage's, under a pipeline) are
    /// gathered once first and stay until the next training step. Collective over the mesh.
    template <class Dataset>
    eval_result eval(Dataset&& dataset) {
        gather_weights();
        auto& net = net_->model();
        double loss_sum = 0;
        std::int64_t right = 0;
        std::size_t samples = 0;
        for (auto&& batch : batches_of(dataset, 0)) {
            auto&& [bx, by] = batch;
            in_dataset_layouts(bx, by, [&](const auto& x, const auto& y) {
                const std::size_t rows = std::size_t(x.shape()[0]);
                samples += rows;
                if constexpr (pipelinable) {
                    if (pipelined()) {
                        const auto [l, r] = runner_for(x).eval_batch(x, y);
                        loss_sum += l * double(rows);
                        right += std::int64_t(r);
                        return;
                    }
                }
                const auto logits = net.forward(x);
                loss_sum += double(loss_->forward(logits, y)) * double(rows);
                right += detail::correct_predictions(logits, y);
            });
        }
        eval_result r;
        r.samples = samples;
        if (samples > 0) {
            r.loss = loss_sum / double(samples);
            r.accuracy = double(right) / double(samples);
        }
        return r;
    }

    /// MindSpore's Model.predict: the model's output for the batch `x` (a distributed tensor,
    /// laid out by the dataset strategy as in a step). Under a pipeline, `x` runs through it
    /// (pipeline::predict: each stage runs only its own modules, with its own weights) and
    /// the last stage's output reaches every stage (MindSpore's output_broadcast). At hsdp
    /// level3 the weights are gathered first, as for eval. Collective over the mesh.
    template <distributed_tensor X>
    auto predict(const X& x) {
        gather_weights();
        const std::vector<layout>& wanted = net_->input_layouts();
        if (wanted.empty() || x.layout() == wanted[0])
            return predict_laid_out(x);
        if constexpr (X::static_layout.dynamic)
            return predict_laid_out(redistribute<X::static_layout>(x, wanted[0]));
        else
            throw error("xshard: model: predict: the batch has the layout " +
                        x.layout().to_string() + " in its type, not the dataset strategy's " +
                        wanted[0].to_string() + "; read it with the strategy's layouts");
    }

    /// Under a pipeline: each stage's current weights broadcast over the pipeline axis, so
    /// that every rank's model holds the whole trained model (to read, save whole, or run
    /// without the pipeline); the model's weights move once. Training and evaluating do not
    /// need it: each stage keeps only its own modules current. Nothing without a pipeline, or
    /// before the pipeline's first step or evaluation. Collective over the mesh.
    void share_stage_weights() {
        gather_weights();
        if (stage_)
            stage_->share_weights();
    }

    /// Saves the parameters (all of them after disable_strategy_file_only_for_trainable_params,
    /// else the trainable ones) and the optimizer's state as a checkpoint of `format` at
    /// `path` with `step` (io/checkpoint.hpp). Collective over the mesh. Under a pipeline, one
    /// integrated checkpoint of every stage (pipeline/checkpoint.hpp: each stage's ranks write
    /// their own modules' blocks and optimizer state; a per-rank format raises on every rank);
    /// before the first step, when no stage has trained yet, the first stage writes the whole
    /// model. At hsdp level3 the weights are gathered first (an all-gather; they stay until the
    /// next step).
    void save_checkpoint(const std::string& path, std::int64_t step,
                         checkpoint_format format = checkpoint_format::integrated) {
        if (pipelined() && format != checkpoint_format::integrated)
            throw error("xshard: trainer::save_checkpoint: a pipeline saves one integrated "
                        "checkpoint of every stage, not a per-rank one");
        gather_weights();
        auto& net = net_->model();
        if (pipelined() && !stage_) {
            agreed_alike<io_error>(net_->mesh().comm(), [&] {
                if (pipeline_rank() == 0)
                    save_checkpoint_on(net, path, step, format);
            });
            return;
        }
        if (stage_) {
            stage_->save(path, step, !net_->strategy_file_only_trainable());
            return;
        }
        save_checkpoint_on(net, path, step, format);
    }

    /// Loads a checkpoint saved by `save_checkpoint` (or model_checkpoint), on any mesh, world
    /// size, layout, hsdp level or pipeline (cut, stage count), into the parameters and the
    /// optimizer's state, and resumes the step count from it (the optimizer's too). Under a
    /// pipeline each stage loads the modules it runs; before the first step (a resumed run)
    /// each stage loads the whole model on its stage mesh, which the pipeline made at the
    /// first step then runs. Collective over the mesh; a missing or damaged file raises
    /// io_error on every rank and leaves the model as it was. At hsdp level3 the weights are
    /// gathered first (storage for the loaded values; the next step takes its shards from
    /// them).
    checkpoint_info load_checkpoint(const std::string& path) {
        gather_weights();
        checkpoint_info info;
        if (stage_) {
            info = stage_->load(path, !net_->strategy_file_only_trainable());
        } else if (pipelined()) {
            info = agreed_alike<io_error>(net_->mesh().comm(),
                                          [&] { return load_checkpoint_on(path); });
        } else {
            info = load_checkpoint_on(path);
        }
        if constexpr (requires { optimizer_->set_steps(info.step); })
            optimizer_->set_steps(info.step);
        steps_ = std::size_t(info.step);
        return info;
    }

    /// Steps trained so far (resumed ones included).
    std::size_t steps() const noexcept { return steps_; }

    /// The optimizer sharding in use: hsdp()'s, or level2's where the gradient path is the
    /// sharded update (driver/gradient_path.hpp); null for the all-reduce and under a
    /// pipeline.
    auto* sharding() const noexcept { return sharding_.get(); }

    /// The factor of the backward seed: the configuration's loss_repetitions() after
    /// disable_loss_repeated_mean(), else 1.
    int loss_gradient_scale() const noexcept { return seed_scale_; }

private:
    bool level3() const noexcept {
        return sharding_ && sharding_->options().optimizer_level == optimizer_level::level3;
    }

    /// hsdp level3: the weights gathered (the model's, or under a pipeline this stage's), so
    /// that they are readable and saveable; they stay until the next training step.
    void gather_weights() {
        if (level3())
            sharding_->gather_weights();
        if (stage_)
            stage_->gather_weights();
    }

    /// The loss's backward seed, times seed_scale_ (disable_loss_repeated_mean) and `share`
    /// (a slice's share of the batch under gradient accumulation).
    auto loss_gradient(double share = 1) {
        auto g = loss_->backward();
        if (seed_scale_ != 1 || share != 1) {
            using V = typename std::remove_cvref_t<decltype(g.local())>::value_type;
            g.local() *= V(double(seed_scale_) * share);
        }
        return g;
    }

    /// Micro-batches per pipelined step: micro_batches, times gradient_accumulation.
    int micro_batches() const noexcept {
        return options_.micro_batches * options_.gradient_accumulation;
    }

    /// gradient_accumulation's passes over the batch (x, y): K slices of every rank's rows,
    /// cut alike in x and y (as many row blocks as the finer of the two splits: pipeline
    /// /micro_batch.hpp), each one forward and backward pass whose loss and seed are weighed
    /// by the slice's share of the rows; the gradients add up in place. Returns the batch's
    /// loss. Throws on every rank alike when the rows do not cut.
    template <class X, class Y>
    double accumulate(const X& x, const Y& y) {
        if constexpr (!distributed_tensor<X> || !distributed_tensor<Y>) {
            throw error("xshard: model: gradient_accumulation cuts the batch and the labels "
                        "into slices of rows: both must be distributed tensors");
        } else {
            const auto& ms = x.mesh().shape();
            const auto bx = std::size_t(x.layout().split_count(0, ms));
            const auto by = std::size_t(y.layout().split_count(0, y.mesh().shape()));
            const std::size_t blocks = std::max(bx, by);
            if (blocks % bx != 0 || blocks % by != 0)
                throw error("xshard: model: gradient_accumulation: the batch's rows in " +
                            std::to_string(bx) + " blocks and the labels' in " +
                            std::to_string(by) + " cannot be cut alike");
            const int k = options_.gradient_accumulation;
            if (pipeline::micro_batch_rows(x.shape()[0], blocks, k).empty())
                throw error("xshard: model: gradient_accumulation " + std::to_string(k) + ": " +
                            pipeline::cut_failure(x.shape()[0], blocks, k));
            const auto xs = pipeline::split_micro_batches(x, k, blocks);
            const auto ys = pipeline::split_micro_batches(y, k, blocks);
            auto& net = net_->model();
            if (level3())
                sharding_->begin_passes();
            double l = 0;
            for (std::size_t i = 0; i < xs.size(); ++i) {
                const double share = double(xs[i].shape()[0]) / double(x.shape()[0]);
                l += share * double(loss_->forward(net.forward(xs[i]), ys[i]));
                net.backward(loss_gradient(share));
            }
            if (level3())
                sharding_->end_passes();
            return l;
        }
    }

    /// The loss a pipeline runs: `Loss` with its backward seed times `scale`.
    struct scaled_loss {
        Loss* loss;
        int scale;
        template <class P, class L>
        auto forward(const P& prediction, const L& labels) {
            return loss->forward(prediction, labels);
        }
        template <class S>
        auto backward(S s) {
            return loss->backward(S(s * S(scale)));
        }
    };

    /// This rank's coordinate along the pipeline axis.
    int pipeline_rank() const { return net_->mesh().coords()[pipeline_axis_]; }

    /// save_checkpoint of the whole model `net` (collective over its mesh).
    void save_checkpoint_on(network_type& net, const std::string& path, std::int64_t step,
                            checkpoint_format format) {
        const checkpoint_options o{.format = format,
                                   .all_parameters = !net_->strategy_file_only_trainable(),
                                   .step = step};
        if constexpr (requires { optimizer_->state_of(net); })
            xshard::save_checkpoint(path, net, o, optimizer_->state_of(net));
        else
            xshard::save_checkpoint(path, net, o);
    }

    /// load_checkpoint of the whole model (collective over its mesh).
    checkpoint_info load_checkpoint_on(const std::string& path) {
        auto& net = net_->model();
        const bool all = !net_->strategy_file_only_trainable();
        if constexpr (requires { optimizer_->state_of(net); })
            return xshard::load_checkpoint(path, net, optimizer_->state_of(net), all);
        else
            return xshard::load_checkpoint(path, net, std::tuple<>{}, all);
    }

    /// The rows of a batch that has a shape (the samples a step's callback reports), else 0.
    template <class X>
    static std::size_t rows_of(const X& x) {
        if constexpr (requires { x.shape()[0]; })
            return std::size_t(x.shape()[0]);
        else
            return 0;
    }

    template <class Dataset>
    static decltype(auto) batches_of(Dataset& dataset, std::size_t e) {
        if constexpr (requires { dataset.epoch(std::uint64_t(e)); })
            return dataset.epoch(std::uint64_t(e));
        else
            return (dataset);
    }

    /// The pipeline, its optimizer sharding and this rank's stage, type-erased over the
    /// batch's type (known at the first step, evaluation or prediction).
    struct stage_runner {
        std::type_index x_type = typeid(void);
        virtual ~stage_runner() = default;
        virtual void finish_step(long step) = 0;
        virtual void share_weights() = 0;
        virtual void gather_weights() = 0;
        virtual void save(const std::string& path, std::int64_t step, bool all) = 0;
        virtual checkpoint_info load(const std::string& path, bool all) = 0;
        virtual std::vector<std::pair<std::string, int>> stages() const = 0;
    };

    template <class X>
    struct stage_runner_of final : stage_runner {
        using pipe_type = xshard::pipeline::pipeline<network_type, X>;
        using local_type =
            std::remove_reference_t<decltype(std::declval<pipe_type&>().local_parameters())>;

        stage_runner_of(trainer& m, const X& x)
            : self(&m)
            , pipe(m.net_->mesh(), m.options_.pipeline_axis, x.mesh(), m.net_->model(),
                   options_of(m)) {
            this->x_type = typeid(X);
            if (m.net_->hsdp_config())
                sharding = std::make_unique<xshard::hsdp<local_type>>(
                    pipe.local_parameters(), *m.net_->hsdp_config(), m.net_->gradient_options());
        }

        static xshard::pipeline::pipeline_options options_of(const trainer& m) {
            auto o = m.net_->pipeline_options(m.micro_batches(), m.options_.stage_config);
            o.output_broadcast = true; // every rank's callbacks see the loss
            // A searched program chain is cut with its modules balanced by the search's
            // predicted seconds, unless the user's stage_config says otherwise or the schedule
            // interleaves (virtual stages the search does not price).
            if (o.stage_config.empty() && o.virtual_stages == 1)
                if constexpr (requires { m.net_->searched_stage_starts(); })
                    if (!m.net_->searched_stage_starts().empty())
                        o.stage_starts = m.net_->searched_stage_starts();
            return o;
        }

        template <class Y>
        double step(const X& xs, const Y& ys) {
            // hsdp level3: the stage's weights gathered once before its first micro-batch,
            // freed after its last backward, whose accumulated gradients are then
            // reduce-scattered into the shards (finish_step waits for them).
            if (sharding)
                sharding->begin_passes();
            double l = 0;
            if (self->seed_scale_ == 1) {
                l = double(pipe.step(xs, ys, *self->loss_));
            } else {
                scaled_loss scaled{self->loss_, self->seed_scale_};
                l = double(pipe.step(xs, ys, scaled));
            }
            if (sharding)
                sharding->end_passes();
            return l;
        }

        void gather_weights() override {
            if (sharding && sharding->options().optimizer_level == optimizer_level::level3)
                sharding->gather_weights();
        }

        void finish_step(long step) override {
            const auto& net = *self->net_;
            auto& local = pipe.local_parameters();
            if (sharding) {
                sharding->synchronize_gradients();
                if (net.local_norm_enabled()) {
                    auto g = sharding->gradients();
                    net.report_local_norms(g, step);
                }
                sharding->step(*self->optimizer_);
            } else {
                pipe.synchronize_gradients(net.gradient_options());
                if (net.local_norm_enabled()) {
                    gradients_of<local_type> g{local};
                    net.report_local_norms(g, step);
                }
                self->optimizer_->step(local);
            }
            pipe.zero_grad();
        }

        void share_weights() override {
            const auto& mesh = self->net_->mesh();
            const communicator& along = mesh.sub(axis_set::of(self->pipeline_axis_));
            std::map<std::string, int> owner;
            for (const auto& [name, s] : pipe.stages())
                owner[name] = pipe.config().rank_of_stage(s);
            visit_parameters(self->net_->model(), [&](std::string_view name, auto& child) {
                const auto it = owner.find(std::string(name));
                if (it == owner.end())
                    return;
                for_each_weight(child, [&](const std::string&, auto& w) {
                    mpi::bcast(along, w.value.local(), it->second);
                });
            });
        }

        /// The batch's (mean loss, correct predictions) on every rank: computed on the last
        /// stage from its output, then broadcast over the pipeline axis.
        template <class Y>
        std::array<double, 2> eval_batch(const X& x, const Y& y) {
            const auto logits = pipe.predict_on_last_stage(&x);
            std::array<double, 2> metrics{};
            agreed_alike(self->net_->mesh().comm(), [&] {
                if (logits) {
                    metrics[0] = double(self->loss_->forward(*logits, y));
                    metrics[1] = double(detail::correct_predictions(*logits, y));
                }
            });
            const int last = pipe.config().rank_of_stage(pipe.config().total_stages() - 1);
            mpi::bcast(self->net_->mesh().sub(axis_set::of(self->pipeline_axis_)),
                       std::span(metrics), last);
            return metrics;
        }

        void save(const std::string& path, std::int64_t step, bool all) override {
            const checkpoint_options o{.all_parameters = all, .step = step};
            auto& local = pipe.local_parameters();
            if constexpr (requires { self->optimizer_->state_of(local); })
                xshard::pipeline::save_pipeline_checkpoint(path, pipe, o,
                                                           self->optimizer_->state_of(local));
            else
                xshard::pipeline::save_pipeline_checkpoint(path, pipe, o);
        }

        checkpoint_info load(const std::string& path, bool all) override {
            auto& local = pipe.local_parameters();
            if constexpr (requires { self->optimizer_->state_of(local); })
                return xshard::pipeline::load_pipeline_checkpoint(
                    path, pipe, self->optimizer_->state_of(local), all);
            else
                return xshard::pipeline::load_pipeline_checkpoint(path, pipe, std::tuple<>{}, all);
        }

        std::vector<std::pair<std::string, int>> stages() const override { return pipe.stages(); }

        trainer* self;
        pipe_type pipe;
        std::unique_ptr<xshard::hsdp<local_type>> sharding;
    };

    /// predict on `x` in the dataset strategy's layout.
    template <distributed_tensor X>
    auto predict_laid_out(const X& x) {
        using output_type = std::remove_cvref_t<decltype(net_->model().forward(x))>;
        if (pipelined()) {
            if constexpr (pipelinable && std::is_constructible_v<output_type, X>)
                return output_type(std::move(*runner_for(x).pipe.predict(x)));
            else
                throw error("xshard: model: predict under a pipeline needs a model whose "
                            "output has its input's type");
        }
        return output_type(net_->model().forward(x));
    }

    /// The pipeline's runner, made from the batch's type at the first step, evaluation or
    /// prediction (collective); later batches must have the same type (raises on every rank
    /// alike).
    template <class X>
    stage_runner_of<X>& runner_for(const X& x) {
        if (!stage_)
            stage_ = std::make_unique<stage_runner_of<X>>(*this, x); // collective
        else if (stage_->x_type != typeid(X))
            throw error("xshard: model: a pipelined model's batches must keep their type from "
                        "one step, evaluation or prediction to the next");
        return static_cast<stage_runner_of<X>&>(*stage_);
    }

    template <class X, class Y>
    double pipeline_step(const X& x, const Y& y) {
        const double l = runner_for(x).step(x, y);
        stage_->finish_step(long(steps_));
        ++steps_;
        return l;
    }

    Parallel* net_;
    Loss* loss_;
    Optimizer* optimizer_;
    trainer_options options_;
    gradients_of<network_type> grads_;
    std::unique_ptr<xshard::hsdp<network_type>> sharding_;
    std::optional<gradient_synchronizer> sync_;
    std::unique_ptr<stage_runner> stage_;
    std::size_t pipeline_axis_ = 0;
    std::size_t steps_ = 0;
    int seed_scale_ = 1;
};

/// The training driver under MindSpore's name (`Model`): `xshard::model driver(net, loss,
/// optimizer)` deduces the same `trainer`.
template <auto_parallel_configuration Parallel, class Loss, class Optimizer>
using model = trainer<Parallel, Loss, Optimizer>;

/// trainer_options under the name that goes with `xshard::model`.
using model_options = trainer_options;

} // namespace xshard
