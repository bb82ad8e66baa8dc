#pragma once
/// \file
/// The training driver, MindSpore's `Model(network, loss_fn, optimizer).train(epoch,
/// train_dataset, callbacks)`, over an `auto_parallel` configuration:
///
///     xshard::auto_parallel net(model, mesh);
///     net.hsdp();
///     xshard::model trainer(net, loss, optimizer);
///     trainer.train(2, loader, {xshard::callbacks::loss_monitor(1)});
///
/// Each step is the manual loop's: forward, loss, backward, gradient synchronisation as
/// configured (xshard::hsdp when hsdp() was called, else a kept gradient_synchronizer with
/// the configured mean, fp32 communication and fusion), the local norms when configured, the
/// optimizer step (on the shards, then the all-gather, under hsdp), zero_grad. The driver adds
/// no collective of its own. Not there yet: pipeline stages > 1 (raises), eval, a checkpoint
/// callback.

#include <xshard/auto/auto_parallel.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/train/gradients.hpp>
#include <xshard/train/monitor.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ranges>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard {

/// What the driver tells its callbacks at the start of training.
struct train_begin_info {
    const communicator* comm;    ///< the mesh's communicator
    std::size_t epochs;          ///< epochs of the run
    std::size_t steps_per_epoch; ///< 0 when the dataset's epochs are not sized
};

/// What the driver tells its callbacks after each step.
struct step_info {
    std::size_t epoch;   ///< from 0
    std::size_t step;    ///< in the epoch, from 0
    double loss;         ///< the step's loss (the same on every rank)
    std::size_t samples; ///< the global batch's samples (0 when unknown)
};

/// A training callback (MindSpore's Callback): any of the three may be empty.
struct callback {
    std::function<void(const train_begin_info&)> on_train_begin = {};
    std::function<void(const step_info&)> on_step = {};
    std::function<void(std::size_t epoch)> on_epoch_end = {};
};

namespace callbacks {

/// MindSpore's LossMonitor(per_print_times): a `loss_monitor` (train/monitor.hpp) reporting
/// every `per_print_times` steps on rank 0 to `out` (0 raises, on every rank alike). No
/// communication.
inline callback loss_monitor(std::size_t per_print_times = 1, monitor_output out = stdout) {
    if (per_print_times == 0)
        throw error("xshard: loss_monitor: per_print_times must be a positive integer, not 0");
    auto monitor = std::make_shared<std::optional<xshard::loss_monitor>>();
    return {.on_train_begin =
                [=](const train_begin_info& t) {
                    monitor->emplace(*t.comm,
                                     loss_monitor_options{.steps_per_epoch = t.steps_per_epoch,
                                                          .epochs = t.epochs,
                                                          .print_every = per_print_times,
                                                          .out = out});
                },
            .on_step = [=](const step_info& s) { (*monitor)->step(s.loss, s.samples); },
            .on_epoch_end =
                [=](std::size_t) {
                    (*monitor)->end_epoch();
                }};
}

} // namespace callbacks

/// An auto_parallel configuration (auto/auto_parallel.hpp).
template <class P>
concept auto_parallel_configuration = requires(P& p) {
    p.compile();
    p.model();
    p.mesh();
    p.gradient_options();
    p.hsdp_config();
};

/// The training driver (see the file comment). `net`, `loss` and `optimizer` must outlive it;
/// `loss` has `forward(prediction, labels) -> double` (the global loss) and `backward()`,
/// the model `forward(x)` and `backward(dy)`. Construction calls `net.compile()` (collective:
/// raises on every rank for what is not supported) and plans the gradient synchronisation.
template <auto_parallel_configuration Parallel, class Loss, class Optimizer>
class model {
public:
    using network_type = std::remove_cvref_t<decltype(std::declval<Parallel&>().model())>;

    model(Parallel& net, Loss& loss, Optimizer& optimizer)
        : net_(&net)
        , loss_(&loss)
        , optimizer_(&optimizer)
        , grads_{net.model()} {
        net.compile();
        agree_on_error(net.mesh().comm(),
                       net.pipeline_settings().stages > 1
                           ? std::optional<std::string>(
                                 "xshard: model: the driver does not run pipeline stages yet "
                                 "(pipeline(" +
                                 std::to_string(net.pipeline_settings().stages) +
                                 ")): use xshard::pipeline::pipeline with "
                                 "net.pipeline_options(...)")
                           : std::nullopt);
        if (net.hsdp_config())
            sharding_ = net.make_hsdp();
        else
            sync_.emplace(net.model(), grads_, net.gradient_options());
    }
    model(const model&) = delete;
    model& operator=(const model&) = delete;

    /// One training step on the batch (x, y); returns its loss. Collective over the mesh.
    template <class X, class Y>
    double train_step(const X& x, const Y& y) {
        auto& net = net_->model();
        const double l = loss_->forward(net.forward(x), y);
        net.backward(loss_->backward());
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

    /// `epochs` epochs over `dataset`: an object with `epoch(e)` giving epoch e's batches (a
    /// data::loader), or a range of batches read again every epoch; each batch destructures
    /// into (x, y). Returns every step's loss. Collective over the mesh.
    template <class Dataset>
    std::vector<double> train(std::size_t epochs, Dataset&& dataset,
                              std::vector<callback> callbacks = {}) {
        const auto batches = [&](std::size_t e) -> decltype(auto) {
            if constexpr (requires { dataset.epoch(std::uint64_t(e)); })
                return dataset.epoch(std::uint64_t(e));
            else
                return (dataset);
        };
        std::size_t steps_per_epoch = 0;
        if constexpr (requires { std::ranges::size(batches(0)); })
            steps_per_epoch = std::size_t(std::ranges::size(batches(0)));
        for (auto& c : callbacks)
            if (c.on_train_begin)
                c.on_train_begin({&net_->mesh().comm(), epochs, steps_per_epoch});
        std::vector<double> losses;
        for (std::size_t e = 0; e < epochs; ++e) {
            std::size_t s = 0;
            for (auto&& batch : batches(e)) {
                auto&& [x, y] = batch;
                const double l = train_step(x, y);
                losses.push_back(l);
                std::size_t samples = 0;
                if constexpr (requires { x.shape()[0]; })
                    samples = std::size_t(x.shape()[0]);
                for (auto& c : callbacks)
                    if (c.on_step)
                        c.on_step({e, s, l, samples});
                ++s;
            }
            for (auto& c : callbacks)
                if (c.on_epoch_end)
                    c.on_epoch_end(e);
        }
        return losses;
    }

    /// The optimizer sharding in use (null without hsdp()).
    auto* sharding() const noexcept { return sharding_.get(); }

private:
    Parallel* net_;
    Loss* loss_;
    Optimizer* optimizer_;
    gradients_of<network_type> grads_;
    std::unique_ptr<xshard::hsdp<network_type>> sharding_;
    std::optional<gradient_synchronizer> sync_;
    std::size_t steps_ = 0;
};

} // namespace xshard
