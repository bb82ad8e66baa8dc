#pragma once
/// \file
/// Activations and gradients between corresponding ranks of two stages: a distributed tensor
/// on one stage's sub-mesh sent to the rank with the same sub-mesh coordinates on another
/// stage, which gets the same tensor (same global shape, same layout, the same block on each
/// rank). Nonblocking point-to-point through comm/ (`isend`, `irecv`): a small header (the
/// global shape and the layout, so the receiver needs no prior knowledge) then the local
/// block. The receiver posts the header's receive early and the block's as soon as the
/// header is in, so transfers proceed while the stages compute.
///
/// A rank whose step fails (a layer or the loss throws) sends, for every transfer it still
/// owes, an *abort* header carrying its error instead; a receiver that gets one stops, sends
/// its own owed transfers as aborts and drains what it still expects, so that every posted
/// message is matched and no rank waits forever (step_transfers.hpp; the pipeline then
/// agrees on the error).
///
/// Both sides lay the boundary tensor out alike (the receiver takes the sender's layout);
/// a boundary between stages laid out differently is a planned cross-mesh redistribution
/// instead (boundary.hpp).

#include <xshard/comm/collectives.hpp>
#include <xshard/comm/request.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <array>
#include <cstdio>
#include <cstring>
#include <list>
#include <optional>
#include <string>

namespace xshard::pipeline {

/// A tensor travelling to another rank, or the news that it never will: kept alive until
/// its messages are delivered.
template <distributed_tensor X>
class outgoing {
public:
    /// Starts sending `x` to rank `to` of `c` with tags `tag` (header) and `tag + 1` (block).
    outgoing(const communicator& c, X x, int to, int tag)
        : x_(std::move(x)) {
        std::string text;
        for (std::size_t d = 0; d < X::rank; ++d)
            text += std::to_string(x_->shape()[d]) + " ";
        text += x_->layout().to_string();
        if (text.size() >= header_.size())
            throw error("xshard: pipeline: the boundary tensor's layout " + text +
                        " is too long to send");
        std::memcpy(header_.data(), text.data(), text.size());
        header_req_ = isend(c, header_, to, tag);
        data_req_ = isend(c, x_->local(), to, tag + 1);
    }

    /// Sends, instead of the tensor, the header of an aborted step with `message` (the
    /// error that stopped this rank), so that the receiver stops waiting.
    outgoing(const communicator& c, const std::string& message, int to, int tag) {
        const auto text = "!" + message.substr(0, header_.size() - 2);
        std::memcpy(header_.data(), text.data(), text.size());
        header_req_ = isend(c, header_, to, tag);
    }

    /// Whether the messages are delivered (progressing them).
    bool done() { return header_req_.test() && data_req_.test(); }
    void wait() {
        header_req_.wait_unheeded();
        data_req_.wait_unheeded();
    }

private:
    std::optional<X> x_;
    std::array<char, 256> header_{};
    request header_req_, data_req_;
};

/// A tensor expected from another rank (see the file comment), or the error that stopped
/// its sender.
template <distributed_tensor X>
class incoming {
public:
    using mesh_type = typename X::mesh_type;

    /// Posts the receive of the header from rank `from` of `c` with tag `tag`; the tensor
    /// will live on `mesh` (this stage's sub-mesh).
    incoming(const communicator& c, const mesh_type& mesh, int from, int tag)
        : comm_(c)
        , mesh_(mesh)
        , from_(from)
        , tag_(tag) {
        header_req_ = irecv(comm_, header_, from_, tag_);
    }
    incoming(const incoming&) = delete;
    incoming& operator=(const incoming&) = delete;

    /// Posts the block's receive if the header is in (cheap; call it often).
    void poll() {
        if (!posted_ && header_req_.test())
            post();
    }

    /// Waits for the tensor and returns it; or, when the sender aborted its step, returns
    /// nothing and `aborted()` holds the sender's error.
    std::optional<X> take() {
        if (!posted_) {
            header_req_.wait_unheeded();
            post();
        }
        if (aborted_)
            return std::nullopt;
        data_req_.wait_unheeded();
        return X(xshard::detail::unchecked, mesh_, shape_, std::move(local_), layout_);
    }

    /// The error of an aborted sender ("" if none).
    const std::string& aborted() const noexcept { return message_; }

private:
    void post() {
        posted_ = true;
        header_.back() = '\0';
        std::string text(header_.data());
        if (!text.empty() && text.front() == '!') {
            aborted_ = true;
            message_ = text.substr(1);
            return;
        }
        std::size_t pos = 0;
        for (std::size_t d = 0; d < X::rank; ++d) {
            const auto space = text.find(' ', pos);
            shape_[d] = std::stoull(text.substr(pos, space - pos));
            pos = space + 1;
        }
        layout_ = layout::parse(text.substr(pos));
        const auto b = block_of(layout_, mesh_.shape(), shape_, mesh_.rank());
        local_ = X::local_type::from_shape(b.extent);
        data_req_ = irecv(comm_, local_, from_, tag_ + 1);
    }

    communicator comm_;
    mesh_type mesh_;
    int from_, tag_;
    std::array<char, 256> header_{};
    request header_req_, data_req_;
    bool posted_ = false, aborted_ = false;
    std::string message_;
    typename X::shape_type shape_{};
    layout layout_;
    typename X::local_type local_;
};

} // namespace xshard::pipeline
