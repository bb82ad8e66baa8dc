#pragma once
/// \file
/// Stage boundaries whose two sides lay the tensor out differently: stages whose meshes
/// factor their ranks differently (stage 0 on dp=2 x tp=2, stage 1 on dp=4 x tp=1), or a
/// stage that asks for its input in a layout of its own (`pipeline_options::
/// stage_input_layouts`). The transfer is then a planned cross-mesh redistribution
/// (redistribute/cross_mesh.hpp) from the sending stage's ranks to the receiving stage's,
/// nonblocking like the corresponding-rank transfer of transfer.hpp.
///
/// Layouts: activations go to the receiving stage's declared input layout, or by default to
/// the layout of the same notation on its mesh (the stage meshes have the same axis names);
/// a gradient goes back to the dual of the layout its activation was sent in (the adjoint
/// of the forward redistribution: replicated axes become pending sums), which is what the
/// sending stage's last layer expects.
///
/// Protocol: every sending rank sends a small header (global shape and layout, or an abort
/// with its error) to every rank of the receiving stage, then its pieces; a receiver that
/// has every header posts the receives of the pieces of the senders that did not abort, so
/// an aborted sender never leaves a message unmatched (see transfer.hpp for aborts).

#include <xshard/compiled.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/request.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/redistribute/cross_mesh.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <array>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace xshard::pipeline {

/// What makes a layout unusable at a stage boundary (see `check_boundary_layout`).
enum class boundary_problem : std::uint8_t {
    none,
    wrong_rank,   ///< the layout is for a tensor of another rank than the boundary tensor
    bad_layout,   ///< it names an axis the stage mesh does not have, or one twice
    partial_input ///< a stage cannot receive its input with a pending reduction
};

/// Whether `l` can be the layout a stage receives its input in, for a boundary tensor of
/// rank `rank` on a stage mesh with axes `names`. Constexpr: a layout written in the source
/// is checked by a static_assert (see tests/pipeline/schedule_static.cpp); the pipeline
/// checks the run-time ones before any data moves.
template <class Names>
constexpr boundary_problem check_boundary_layout(const layout& l, std::size_t rank,
                                                 const Names& names) {
    if (l.rank() != rank)
        return boundary_problem::wrong_rank;
    if (l.check(names) != layout_problem::none)
        return boundary_problem::bad_layout;
    if (l.is_partial())
        return boundary_problem::partial_input;
    return boundary_problem::none;
}

namespace detail {

/// The header of a cross-mesh transfer: "shape... layout", or "!error".
XSHARD_DECL std::array<char, 256> boundary_header(const std::string& text);

} // namespace detail

/// A boundary tensor going to every rank of another stage through a cross-mesh plan (see
/// the file comment), or the news that it never will. Kept alive until delivered.
template <distributed_tensor X>
class cross_outgoing {
public:
    using value_type = typename X::value_type;
    using plan_type = cross_mesh_plan<value_type, X::rank>;

    /// Starts sending `x` (this rank's block of it, on mesh `src` of `c`) to the ranks of
    /// mesh `dst` in layout `to`, with tags `tag` (headers) and `tag + 1` (pieces).
    cross_outgoing(const communicator& c, X x, const placed_mesh& src, const placed_mesh& dst,
                   const layout& to, int tag)
        : x_(std::move(x)) {
        std::string text;
        for (std::size_t d = 0; d < X::rank; ++d)
            text += std::to_string(x_->shape()[d]) + " ";
        text += x_->layout().to_string();
        if (text.size() >= 255)
            throw error("xshard: pipeline: the boundary tensor's layout " + text +
                        " is too long to send");
        header_ = detail::boundary_header(text);
        plan_ = std::make_unique<plan_type>(c, x_->shape(), src, x_->layout(), dst, to, tag + 1);
        for (const int r : dst.ranks)
            headers_.push_back(isend(c, header_, r, tag));
        plan_->post_sends(x_->local().data());
    }

    /// Sends abort headers carrying `message` to every rank of `dst` instead.
    cross_outgoing(const communicator& c, const std::string& message, const placed_mesh& dst,
                   int tag)
        : header_(detail::boundary_header("!" + message.substr(0, 250))) {
        for (const int r : dst.ranks)
            headers_.push_back(isend(c, header_, r, tag));
    }

    cross_outgoing(const cross_outgoing&) = delete;
    cross_outgoing& operator=(const cross_outgoing&) = delete;

    bool done() {
        bool all = true;
        for (auto& h : headers_)
            all = h.test() && all;
        return (!plan_ || plan_->test()) && all;
    }
    void wait() {
        for (auto& h : headers_)
            h.wait();
        if (plan_)
            plan_->wait();
    }

private:
    std::optional<X> x_;
    std::array<char, 256> header_{};
    std::vector<request> headers_;
    std::unique_ptr<plan_type> plan_;
};

/// A boundary tensor expected from the ranks of another stage through a cross-mesh plan.
template <distributed_tensor X>
class cross_incoming {
public:
    using value_type = typename X::value_type;
    using mesh_type = typename X::mesh_type;
    using plan_type = cross_mesh_plan<value_type, X::rank>;
    /// The destination layout, from the layout the sender's header names.
    using layout_rule = std::function<layout(const layout&)>;

    /// Posts the receives of the headers from every rank of `src` (of `c`); the tensor will
    /// live on `mesh` (this rank's stage mesh, placed as `dst`), in the layout `rule` gives.
    cross_incoming(const communicator& c, const mesh_type& mesh, placed_mesh src, placed_mesh dst,
                   layout_rule rule, int tag)
        : comm_(c)
        , mesh_(mesh)
        , src_(std::move(src))
        , dst_(std::move(dst))
        , rule_(std::move(rule))
        , tag_(tag)
        , headers_(src_.ranks.size()) {
        for (std::size_t i = 0; i < src_.ranks.size(); ++i)
            header_reqs_.push_back(irecv(comm_, headers_[i], src_.ranks[i], tag_));
    }
    cross_incoming(const cross_incoming&) = delete;
    cross_incoming& operator=(const cross_incoming&) = delete;

    /// Posts the pieces' receives once every header is in (cheap; call it often).
    void poll() {
        if (posted_)
            return;
        for (auto& h : header_reqs_)
            if (!h.test())
                return;
        post();
    }

    /// Waits for the tensor; or returns nothing when a sender aborted (`aborted()` holds
    /// its error), after draining the pieces of the others.
    std::optional<X> take() {
        if (!posted_) {
            for (auto& h : header_reqs_)
                h.wait();
            post();
        }
        if (plan_)
            plan_->wait();
        if (!message_.empty())
            return std::nullopt;
        plan_->finish(nullptr, local_.data());
        return X(xshard::detail::unchecked, mesh_, shape_, std::move(local_),
                 plan_->destination_layout());
    }

    const std::string& aborted() const noexcept { return message_; }
    /// The layout the senders sent in (after `take`).
    const layout& source_layout() const noexcept { return from_; }

private:
    void post() {
        posted_ = true;
        std::vector<bool> skip(src_.ranks.size(), false);
        std::optional<std::string> good;
        for (std::size_t i = 0; i < headers_.size(); ++i) {
            headers_[i].back() = '\0';
            std::string text(headers_[i].data());
            if (!text.empty() && text.front() == '!') {
                skip[i] = true;
                if (message_.empty())
                    message_ = text.substr(1);
            } else if (!good) {
                good = text;
            }
        }
        if (!good)
            return; // every sender aborted: nothing comes
        std::size_t pos = 0;
        for (std::size_t d = 0; d < X::rank; ++d) {
            const auto space = good->find(' ', pos);
            shape_[d] = std::stoull(good->substr(pos, space - pos));
            pos = space + 1;
        }
        from_ = layout::parse(good->substr(pos));
        plan_ =
            std::make_unique<plan_type>(comm_, shape_, src_, from_, dst_, rule_(from_), tag_ + 1);
        local_ = X::local_type::from_shape(plan_->destination_block().extent);
        plan_->post_receives(local_.data(), &skip);
    }

    communicator comm_;
    mesh_type mesh_;
    placed_mesh src_, dst_;
    layout_rule rule_;
    int tag_;
    std::vector<std::array<char, 256>> headers_;
    std::vector<request> header_reqs_;
    bool posted_ = false;
    std::string message_;
    layout from_;
    typename X::shape_type shape_{};
    std::unique_ptr<plan_type> plan_;
    typename X::local_type local_;
};

} // namespace xshard::pipeline

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/pipeline/boundary.ipp>
#endif
