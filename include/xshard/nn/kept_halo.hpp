#pragma once
/// \file
/// The halo exchange a windowed layer (conv2d, max/avg pooling) runs at every step when its
/// NCHW input splits height and/or width (spatial parallelism), kept like
/// `kept_redistribution`: the `spatial_op` (ops/spatial.hpp: the halo plan of the planner's
/// `halo` step, its datatypes and band buffer) is built on first use and reused while the
/// input fits it (the same mesh, global shape and layout), rebuilt when it does not.
///
/// The layers' activations have their layout's block shapes by construction, so the exchange
/// runs without `spatial_op::exchange`'s agreement round (`exchange_block`), and a rank whose
/// band is its own block (`trivial`) sends, receives and copies nothing.
///
/// A layer calls `band(x)` forward (its extended band: own rows plus the neighbours' halo
/// rows), runs its local kernel on it with `padding()` (the window's own at the image border,
/// 0 where a halo serves) and gets exactly its block of output rows (the output keeps the
/// input's height/width split); backward it runs the local backward on the band and hands
/// the band's gradient to `adjoint`, which sums the halo entries back onto the ranks owning
/// those rows. Bands thinner than the halo are an `xshard::error` with a sentence on every
/// rank alike (redistribute/halo.hpp, `check_halo`).
///
/// `bytes_sent()` counts the bytes the halo handed to MPI on this rank (forward exchanges and
/// adjoints, since construction); the layers report it as `halo_bytes_sent()`, summed by the
/// blocks and the ResNet, for the benchmarks' per-step figures.

#include <xshard/nn/module.hpp>
#include <xshard/nn/step_profile.hpp>
#include <xshard/ops/conv_kernels.hpp>
#include <xshard/ops/spatial.hpp>

#include <optional>

namespace xshard::nn {

/// Whether an NCHW layout splits height or width: the layers' spatial path.
inline bool splits_image(const layout& l) {
    return l.rank() == 4 && (l.is_split(2) || l.is_split(3));
}

/// A layer's halo exchange kept across steps: see the file comment.
template <class T, mesh_type Mesh>
class kept_halo {
public:
    using tensor_type = tensor<T, Mesh, 4>;
    using local_type = typename tensor_type::local_type;

    kept_halo() = default;
    kept_halo(const kept_halo&) noexcept {}
    kept_halo& operator=(const kept_halo&) noexcept {
        op_.reset();
        return *this;
    }
    kept_halo(kept_halo&&) noexcept = default;
    kept_halo& operator=(kept_halo&&) noexcept = default;

    /// `x`'s extended band along `windows` (ops::windows_of the layer's geometry). Collective over
    /// the mesh (see spatial_op::exchange); plans first when `x` does not fit the kept plan.
    const local_type& band(const tensor_type& x, const windowed_dims& windows) {
        const profile_scope timed(step_part::halo);
        if (!op_ || !op_->fits(x))
            op_.emplace(x, windows);
        if (trivial()) // the band is the block: no message, no copy
            return x.local();
        const auto& b = op_->exchange_block(x);
        bytes_ += op_->plan().bytes_sent();
        return b;
    }

    /// Whether the last `band` was this rank's block itself (a window that needs no row of
    /// the neighbours here, e.g. a 1x1 stride-2 shortcut on even bands): then `band` returned
    /// the block, and `adjoint` would return its argument (the layers skip it).
    bool trivial() const noexcept { return op_ && op_->plan().trivial(); }

    /// The padding the local kernel applies around the band of the last `band` call.
    ops::padding2d padding() const {
        const auto& before = op_->plan().pad_before();
        const auto& after = op_->plan().pad_after();
        return {before[2], after[2], before[3], after[3]};
    }

    /// The gradient of this rank's input block from that of its band (the halo step's
    /// adjoint: the neighbours' halo entries summed in). Collective like `band`.
    local_type adjoint(const local_type& grad_band) {
        const profile_scope timed(step_part::halo);
        if (trivial())
            return grad_band;
        auto g = op_->adjoint(grad_band);
        bytes_ += op_->plan().bytes_sent();
        return g;
    }

    /// The kept spatial operation (its plan: geometry, summary, describe()).
    const ops::spatial_op<tensor_type>& op() const { return *op_; }

    /// Bytes this rank's halo steps handed to MPI since construction (forward and adjoint).
    std::size_t bytes_sent() const noexcept { return bytes_; }

private:
    std::optional<ops::spatial_op<tensor_type>> op_;
    std::size_t bytes_ = 0;
};

} // namespace xshard::nn
