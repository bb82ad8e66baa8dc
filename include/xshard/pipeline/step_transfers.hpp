#pragma once
/// \file
/// The transfers of one pipeline step on one rank: the receives of every boundary tensor
/// its row of the schedule expects, posted before its first action so that transfers
/// proceed while the stages compute; the sends its actions make, kept until delivered; the
/// hand-overs between two virtual stages of the rank itself. Each transfer goes between
/// corresponding ranks (transfer.hpp) or, over a cross-mesh boundary, through a cross-mesh
/// plan (boundary.hpp; which boundaries are, topology.hpp). A gradient crossing such a
/// boundary goes back in the dual of the layout its activation crossed in, which the ranks
/// on either side record per (stage, micro-batch).
///
/// When the step fails on this rank (a layer or the loss throws, or a sender aborted), the
/// transfers it still owes go out as aborts carrying the error and the ones it still
/// expects are drained, so that every posted message is matched and no rank waits forever.

#include <xshard/core/layout.hpp>
#include <xshard/pipeline/action.hpp>
#include <xshard/pipeline/boundary.hpp>
#include <xshard/pipeline/schedule.hpp>
#include <xshard/pipeline/topology.hpp>
#include <xshard/pipeline/transfer.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>

namespace xshard::pipeline::detail {

/// An aborted sender's error, seen by a receiver.
struct peer_aborted {
    std::string message;
};

/// The tag of the transfer into (virtual) stage `stage` of micro-batch `mb`: direction 0
/// activations, 1 gradients; the header on the even tag, the block on the next.
constexpr int transfer_tag(const schedule_config& c, int direction, int mb, int stage) {
    return ((stage * c.micro_batches + mb) * 2 + direction) * 2;
}

/// The tag of the transfer that action `a` receives.
constexpr int receive_tag(const schedule_config& c, const action& a) {
    return transfer_tag(c, a.kind == pass::forward ? 0 : 1, a.micro_batch, a.stage);
}

/// The tag of the transfer that action `a` sends.
constexpr int send_tag(const schedule_config& c, const action& a) {
    return transfer_tag(c, a.kind == pass::forward ? 0 : 1, a.micro_batch,
                        a.kind == pass::forward ? a.stage + 1 : a.stage - 1);
}

/// The (virtual) stage whose input boundary the transfer that action `a` receives crosses.
constexpr int received_boundary(const action& a) {
    return a.kind == pass::forward ? a.stage : a.stage + 1;
}

/// The (virtual) stage whose input boundary the transfer that action `a` sends crosses.
constexpr int sent_boundary(const action& a) {
    return a.kind == pass::forward ? a.stage + 1 : a.stage;
}

/// One step's transfers on this rank (see the file comment). Lives for one step; neither
/// copied nor moved (the posted receives refer to it).
template <distributed_tensor X>
class step_transfers {
public:
    using mesh_type = typename X::mesh_type;

    /// Posts the receives of every transfer from another rank that `mine` (this rank's row
    /// of the schedule) expects.
    step_transfers(const stage_topology<mesh_type>& topo, std::span<const action> mine)
        : topo_(topo)
        , me_(topo.pp.rank()) {
        for (const auto& a : mine)
            if (a.recv_from >= 0 && a.recv_from != me_)
                post_receive(a);
    }
    step_transfers(const step_transfers&) = delete;
    step_transfers& operator=(const step_transfers&) = delete;

    /// The boundary tensor action `a` needs: the activation of the previous stage for a
    /// forward pass, the gradient of the next for a backward one; handed over by this rank
    /// or waited for. Throws `peer_aborted` when its sender aborted the step.
    X receive(const action& a) {
        const int tag = receive_tag(topo_.config, a);
        if (a.recv_from == me_) {
            auto node = local_.extract(tag);
            return std::move(node.mapped());
        }
        if (auto c = cross_inbox_.extract(tag)) {
            auto t = c.mapped()->take();
            if (!t)
                throw peer_aborted{c.mapped()->aborted()};
            if (a.kind == pass::forward)
                received_layout_[{a.stage, a.micro_batch}] = c.mapped()->source_layout();
            return std::move(*t);
        }
        auto node = inbox_.extract(tag);
        auto t = node.mapped()->take();
        if (!t)
            throw peer_aborted{node.mapped()->aborted()};
        return std::move(*t);
    }

    /// Sends `t`, the result of action `a`, to the rank `a` names (a hand-over when that is
    /// this rank). Nonblocking.
    void send(const action& a, X t) {
        const int tag = send_tag(topo_.config, a);
        if (a.send_to == me_) {
            local_.emplace(tag, std::move(t));
        } else if (topo_.cross_boundary(sent_boundary(a))) {
            const auto& from = topo_.placed[std::size_t(me_)];
            const auto& to = topo_.placed[std::size_t(a.send_to)];
            layout l;
            if (a.kind == pass::forward) {
                sent_layout_[{a.stage, a.micro_batch}] = t.layout();
                l = topo_.input_layout(a.stage + 1, t.layout());
            } else {
                l = gradient_layout(received_layout_, a.stage, a.micro_batch, a.send_to);
            }
            cross_outbox_.emplace_back(topo_.cross, std::move(t), from, to, l, tag);
        } else {
            outbox_.emplace_back(topo_.pp, std::move(t), a.send_to, tag);
        }
    }

    /// Progresses the transfers: posts the receives of blocks whose headers are in, forgets
    /// the sends delivered. Cheap; called after every action.
    void progress() {
        for (auto& [t, in] : inbox_)
            in->poll();
        for (auto& [t, in] : cross_inbox_)
            in->poll();
        outbox_.remove_if([](auto& o) { return o.done(); });
        cross_outbox_.remove_if([](auto& o) { return o.done(); });
    }

    /// After a failure with `message`: sends an abort in place of every transfer to another
    /// rank that the actions `owed` (those not run) would have sent, then takes and drops
    /// every transfer still expected.
    void abort(std::span<const action> owed, const std::string& message) {
        for (const auto& a : owed) {
            if (a.send_to < 0 || a.send_to == me_)
                continue;
            const int tag = send_tag(topo_.config, a);
            if (topo_.cross_boundary(sent_boundary(a)))
                cross_outbox_.emplace_back(topo_.cross, message,
                                           topo_.placed[std::size_t(a.send_to)], tag);
            else
                outbox_.emplace_back(topo_.pp, message, a.send_to, tag);
        }
        for (auto& [t, in] : inbox_)
            in->take();
        for (auto& [t, in] : cross_inbox_)
            in->take();
    }

    /// Waits until every send is delivered.
    void wait() {
        for (auto& o : outbox_)
            o.wait();
        for (auto& o : cross_outbox_)
            o.wait();
    }

private:
    using records = std::map<std::pair<int, int>, layout>;

    void post_receive(const action& a) {
        const int tag = receive_tag(topo_.config, a);
        if (!topo_.cross_boundary(received_boundary(a))) {
            inbox_.emplace(tag,
                           std::make_unique<incoming<X>>(topo_.pp, topo_.mesh, a.recv_from, tag));
            return;
        }
        typename cross_incoming<X>::layout_rule rule;
        if (a.kind == pass::forward)
            rule = [this, s = a.stage](const layout& sent) {
                return topo_.input_layout(s, sent);
            };
        else
            rule = [this, s = a.stage, mb = a.micro_batch](const layout&) {
                return gradient_layout(sent_layout_, s, mb, me_);
            };
        cross_inbox_.emplace(tag,
                             std::make_unique<cross_incoming<X>>(
                                 topo_.cross, topo_.mesh, topo_.placed[std::size_t(a.recv_from)],
                                 topo_.placed[std::size_t(me_)], std::move(rule), tag));
    }

    /// The layout a gradient of (stage, mb) crosses back in to pipeline rank `to_rank`: the
    /// dual, on that rank's stage mesh, of the layout its activation crossed in. A missing
    /// record means the step is aborting: any layout does then.
    layout gradient_layout(const records& r, int stage, int mb, int to_rank) const {
        const auto it = r.find({stage, mb});
        const auto& shape = topo_.shapes[std::size_t(to_rank)];
        return it == r.end() ? layout::replicated(X::rank) : dual(it->second, shape);
    }

    const stage_topology<mesh_type>& topo_;
    int me_;
    std::map<int, std::unique_ptr<incoming<X>>> inbox_;
    std::map<int, std::unique_ptr<cross_incoming<X>>> cross_inbox_;
    std::map<int, X> local_; ///< hand-overs between virtual stages of this rank
    std::list<outgoing<X>> outbox_;
    std::list<cross_outgoing<X>> cross_outbox_;
    /// The layouts of the activations sent / received across cross-mesh boundaries, per
    /// (stage, micro-batch).
    records sent_layout_, received_layout_;
};

} // namespace xshard::pipeline::detail
