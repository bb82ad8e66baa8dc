#pragma once
/// \file
/// One training step on one rank of a pipeline: the walk of its row of the schedule table
/// (schedule.hpp), one action after the other. A forward pass takes its input (the first
/// stage's micro-batch, or the previous stage's activation), runs the stage's layers in a
/// free activation slot (slots.hpp) and sends its output on; on the last stage it computes
/// the micro-batch's loss and the loss's gradient at once instead. A backward pass takes the
/// gradient (the loss's, or the next stage's), runs the layers backwards in the micro-batch's
/// slot, adding into the weights' gradients, frees the slot and sends the input gradient
/// back; the zero-bubble schedules split it into B (the input gradient) and W (the weight
/// gradient, which frees the slot). The transfers go through step_transfers.hpp. A walk of
/// forward passes alone (inference, make_forward_schedule) frees each slot at once and keeps
/// the last stage's outputs instead of computing a loss.
///
/// A failure (a layer or the loss throwing here, a peer's failure notice, or an aborted
/// sender) stops the walk; a failure that arose here is announced to the stage mesh at once
/// (comm/watch.hpp), the transfers still owed go out as aborts and the expected ones are
/// drained, and the walk returns the error for the ranks to agree on.

#include <xshard/pipeline/action.hpp>
#include <xshard/pipeline/chain.hpp>
#include <xshard/pipeline/slots.hpp>
#include <xshard/pipeline/step_batch.hpp>
#include <xshard/pipeline/step_transfers.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <exception>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace xshard::pipeline {

/// What the last step measured on this rank.
struct step_stats {
    double seconds = 0;      ///< the step, from its start to its last transfer delivered
    double busy_seconds = 0; ///< computing (forward, backward, loss)
    int peak_in_flight = 0;  ///< micro-batches whose activations were kept at once
    /// The idle share of the step (waiting for transfers or for neighbours).
    double bubble() const { return seconds > 0 ? 1.0 - busy_seconds / seconds : 0.0; }
};

namespace detail {

using step_clock = std::chrono::steady_clock;

/// The seconds from `start` until now.
inline double seconds_since(step_clock::time_point start) {
    return std::chrono::duration<double>(step_clock::now() - start).count();
}

/// The `Loss` of a walk of forward passes alone (see the file comment).
struct no_loss {};

/// The walk of one step on one rank (see the file comment): the layers of each (virtual)
/// stage in chain order, the last stage's index, the step's micro-batches, the loss (see
/// pipeline::step; `no_loss` for inference), the step's transfers and the statistics it
/// adds to.
template <distributed_tensor X, distributed_tensor Labels, class Loss>
class step_walk {
public:
    using value_type = typename X::value_type;
    using stage_layers = std::vector<std::vector<chain_module<X>*>>;
    static constexpr bool inference = std::same_as<Loss, no_loss>;

    step_walk(const communicator& scope, const stage_layers& layers, int last_stage,
              step_batch<X, Labels>& batch, Loss& loss, step_transfers<X>& transfers,
              step_stats& stats)
        : scope_(scope)
        , layers_(layers)
        , last_(last_stage)
        , batch_(batch)
        , loss_(loss)
        , transfers_(transfers)
        , stats_(stats) {}

    /// Runs the actions `mine` in order until one fails; then sends aborts for the
    /// transfers the rest owe and drains those expected. Waits for every send. Returns the
    /// error that stopped the walk, if any.
    std::optional<std::string> run(std::span<const action> mine) {
        std::optional<std::string> failure;
        std::size_t stopped = mine.size();
        for (std::size_t i = 0; i < mine.size() && !failure; ++i) {
            try {
                act(mine[i]);
            } catch (const peer_aborted& e) {
                failure = e.message;
                stopped = i;
            } catch (const peer_failure& e) {
                failure = e.message();
                origin_ = e.rank();
                stopped = i;
            } catch (const std::exception& e) {
                failure = e.what();
                first_hand_ = true;
                // Told at once: the members of this rank's stage mesh waiting in a collective
                // with it (inside the stage's layers) would otherwise wait for ever. The other
                // stages learn of it through the aborted transfers.
                xshard::detail::announce_failure(scope_.native(), *failure);
                stopped = i;
            }
            transfers_.progress();
        }
        if (failure)
            transfers_.abort(mine.subspan(stopped), *failure);
        transfers_.wait();
        return failure;
    }

    /// Whether the error that stopped the walk arose here (a layer or the loss throwing),
    /// not in a peer: then its notice has gone to every rank of the scope (comm/watch.hpp).
    bool first_hand() const noexcept { return first_hand_; }
    /// The rank (in MPI_COMM_WORLD) the error that stopped the walk names.
    int origin() const noexcept { return origin_; }

    /// The last stage's loss over the micro-batches run, each weighed by its share of rows.
    value_type loss_sum() const noexcept { return loss_sum_; }

    /// Inference, on the last stage: the outputs of the micro-batches, in order.
    std::vector<X> take_outputs() {
        std::vector<X> out;
        for (auto& [mb, y] : outputs_)
            out.push_back(std::move(y));
        return out;
    }

private:
    void act(const action& a) {
        if (a.kind == pass::forward)
            forward(a);
        else if (a.kind == pass::backward_weight)
            backward_weight(a);
        else
            backward(a);
    }

    void forward(const action& a) {
        const auto& layers = layers_[std::size_t(a.stage)];
        const auto mb = std::size_t(a.micro_batch);
        X h = a.stage == 0 ? std::move(batch_.inputs[mb]) : transfers_.receive(a);
        const std::size_t slot = slots_.acquire(a.stage, a.micro_batch);
        stats_.peak_in_flight = slots_.peak();
        timed([&] {
            for (auto* l : layers)
                h = l->forward(slot, h);
            if constexpr (!inference)
                if (a.stage == last_)
                    take_loss(a.micro_batch, h);
        });
        if constexpr (inference)
            slots_.release(a.stage, a.micro_batch);
        if (a.stage != last_)
            transfers_.send(a, std::move(h));
        else if constexpr (inference)
            outputs_.emplace(a.micro_batch, std::move(h));
    }

    /// The last stage: the loss of micro-batch `mb` on its `logits`, added to the step's
    /// loss, and its gradient kept for the micro-batch's backward pass.
    void take_loss(int mb, const X& logits) requires(!std::same_as<Loss, no_loss>) {
        const auto& y = batch_.labels[std::size_t(mb)];
        const auto share = batch_.template share<value_type>(mb);
        loss_sum_ += share * value_type(loss_.forward(logits, y));
        output_grad_.emplace(mb, X(loss_.backward(share)));
    }

    /// B (the whole backward pass, or its input half when `a` is split).
    void backward(const action& a) {
        const auto& layers = layers_[std::size_t(a.stage)];
        X g = [&] {
            if (a.stage != last_)
                return transfers_.receive(a);
            auto node = output_grad_.extract(a.micro_batch);
            return std::move(node.mapped());
        }();
        const auto slot = slots_.at(a.stage, a.micro_batch);
        const bool split = a.kind == pass::backward_input;
        timed([&] {
            for (auto it = layers.rbegin(); it != layers.rend(); ++it)
                g = split ? (*it)->backward_input(slot, g) : (*it)->backward(slot, g);
        });
        if (!split)
            slots_.release(a.stage, a.micro_batch);
        if (a.stage != 0)
            transfers_.send(a, std::move(g));
    }

    /// W: the weight gradients of a split backward pass.
    void backward_weight(const action& a) {
        const auto& layers = layers_[std::size_t(a.stage)];
        const auto slot = slots_.at(a.stage, a.micro_batch);
        timed([&] {
            for (auto it = layers.rbegin(); it != layers.rend(); ++it)
                (*it)->backward_weight(slot);
        });
        slots_.release(a.stage, a.micro_batch);
    }

    /// Runs `f`, counting its time as busy.
    template <class F>
    void timed(F&& f) {
        const auto start = step_clock::now();
        f();
        stats_.busy_seconds += seconds_since(start);
    }

    const communicator& scope_; // who hears of a first-hand failure: the stage mesh
    const stage_layers& layers_;
    int last_;
    step_batch<X, Labels>& batch_;
    Loss& loss_;
    step_transfers<X>& transfers_;
    step_stats& stats_;
    bool first_hand_ = false;
    int origin_ = xshard::detail::world_rank();
    activation_slots slots_;
    std::map<int, X> output_grad_; ///< last stage: the loss's gradient per micro-batch
    std::map<int, X> outputs_;     ///< last stage, inference: the output per micro-batch
    value_type loss_sum_ = 0;
};

} // namespace detail

} // namespace xshard::pipeline
