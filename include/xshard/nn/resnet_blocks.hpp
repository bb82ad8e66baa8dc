#pragma once
/// \file
/// ResNet's residual blocks (MindSpore's ResidualBlock / PyTorch's BasicBlock and
/// Bottleneck) and the residual add they end with.
///
/// A block is its main branch (convolutions, batch norms, ReLUs) plus a shortcut (the input
/// itself, or a 1x1 strided convolution and batch norm where the shape changes), added and
/// passed through a ReLU. With `block_options::model_parallel`, the main branch is
/// Megatron-style over `axis`: the first convolution splits its output channels (its batch
/// norm and ReLU work on the split channels, no message), the next one splits its input
/// channels and all-reduces its pending sum (one all-reduce of the output block forward, one
/// backward). The batch may be split over any other axis (data parallelism).

#include <xshard/nn/activation.hpp>
#include <xshard/nn/batch_norm2d.hpp>
#include <xshard/nn/conv2d.hpp>

#include <optional>

namespace xshard::nn {

/// How the blocks of a network are laid out.
struct block_options {
    bool model_parallel = false; ///< split the inner channels over `axis`
    std::string axis = "mp";
    bool sync_bn = false; ///< synchronised batch norm over the batch's axes
};

/// a + b (the residual add): b is brought to a's layout first when they differ (a
/// redistribution). Local otherwise.
template <class T, mesh_type Mesh>
tensor<T, Mesh, 4> residual_add(tensor<T, Mesh, 4> a, const tensor<T, Mesh, 4>& b) {
    if (a.layout() == b.layout()) {
        a.local() += b.local();
        return a;
    }
    const auto c = redistribute<dynamic_layout(4)>(b, a.layout());
    a.local() += c.local();
    return a;
}

namespace detail {

/// The shortcut of a block: identity, or 1x1 convolution (stride s) + batch norm.
template <class T, mesh_type Mesh>
struct shortcut {
    std::optional<conv2d<T, Mesh>> conv;
    std::optional<batch_norm2d<T, Mesh>> bn;

    shortcut(const Mesh& mesh, std::size_t in, std::size_t out, std::size_t stride, unsigned seed,
             const block_options& o) {
        if (stride != 1 || in != out) {
            conv.emplace(mesh, in, out, 1, seed,
                         typename conv2d<T, Mesh>::options{.stride = stride});
            bn.emplace(mesh, out, typename batch_norm2d<T, Mesh>::options{.sync = o.sync_bn});
        }
    }
    tensor<T, Mesh, 4> forward(const tensor<T, Mesh, 4>& x) {
        return conv ? bn->forward(conv->forward(x)) : x;
    }
    tensor<T, Mesh, 4> backward(const tensor<T, Mesh, 4>& dy) {
        return conv ? conv->backward(bn->backward(dy)) : dy;
    }
    void train(bool on) {
        if (bn)
            bn->train(on);
    }
    std::size_t halo_bytes_sent() const { return conv ? conv->halo_bytes_sent() : 0; }
    void visit(auto&& visit) {
        if (conv) {
            visit("downsample.0", *conv);
            visit("downsample.1", *bn);
        }
    }
};

template <class T, mesh_type Mesh>
typename conv2d<T, Mesh>::options conv_options(std::size_t stride, std::size_t padding,
                                               channel_split split, const block_options& o) {
    typename conv2d<T, Mesh>::options c;
    c.stride = stride;
    c.padding = padding;
    c.split = o.model_parallel ? split : channel_split::none;
    c.axis = o.axis;
    return c;
}

template <class T, mesh_type Mesh>
typename batch_norm2d<T, Mesh>::options bn_options(bool split, const block_options& o) {
    typename batch_norm2d<T, Mesh>::options b;
    b.sync = o.sync_bn;
    b.axis = o.model_parallel && split ? o.axis : "";
    return b;
}

} // namespace detail

/// The basic block (ResNet-18/34): 3x3 conv (stride s) - BN - ReLU - 3x3 conv - BN, plus the
/// shortcut, then ReLU. Expansion 1.
template <class T, mesh_type Mesh>
class basic_block {
public:
    static constexpr std::size_t expansion = 1;

    basic_block(const Mesh& mesh, std::size_t in, std::size_t planes, std::size_t stride,
                unsigned seed, const block_options& o = {})
        : conv1_(mesh, in, planes, 3, seed,
                 detail::conv_options<T, Mesh>(stride, 1, channel_split::output, o))
        , bn1_(mesh, planes, detail::bn_options<T, Mesh>(true, o))
        , relu1_(mesh)
        , conv2_(mesh, planes, planes, 3, seed + 1,
                 detail::conv_options<T, Mesh>(1, 1, channel_split::input, o))
        , bn2_(mesh, planes, detail::bn_options<T, Mesh>(false, o))
        , shortcut_(mesh, in, planes, stride, seed + 2, o)
        , relu_(mesh) {}

    tensor<T, Mesh, 4> forward(const tensor<T, Mesh, 4>& x) {
        auto y = bn2_.forward(conv2_.forward(relu1_.forward(bn1_.forward(conv1_.forward(x)))));
        return relu_.forward(residual_add(std::move(y), shortcut_.forward(x)));
    }

    tensor<T, Mesh, 4> backward(const tensor<T, Mesh, 4>& dy) {
        const auto g = relu_.backward(dy);
        auto dx =
            conv1_.backward(bn1_.backward(relu1_.backward(conv2_.backward(bn2_.backward(g)))));
        return residual_add(std::move(dx), shortcut_.backward(g));
    }

    void train(bool on) {
        bn1_.train(on);
        bn2_.train(on);
        shortcut_.train(on);
    }

    /// Bytes this rank's halo exchanges sent so far (spatial parallelism; 0 without).
    std::size_t halo_bytes_sent() const {
        return conv1_.halo_bytes_sent() + conv2_.halo_bytes_sent() + shortcut_.halo_bytes_sent();
    }

    friend void visit_parameters(basic_block& b, auto&& visit) {
        visit("conv1", b.conv1_);
        visit("bn1", b.bn1_);
        visit("conv2", b.conv2_);
        visit("bn2", b.bn2_);
        b.shortcut_.visit(visit);
    }

private:
    conv2d<T, Mesh> conv1_;
    batch_norm2d<T, Mesh> bn1_;
    relu_activation<T, Mesh, 4> relu1_;
    conv2d<T, Mesh> conv2_;
    batch_norm2d<T, Mesh> bn2_;
    detail::shortcut<T, Mesh> shortcut_;
    relu_activation<T, Mesh, 4> relu_;
};

/// The bottleneck block (ResNet-50/101/152, MindSpore's ResidualBlock): 1x1 conv - BN - ReLU
/// - 3x3 conv (stride s) - BN - ReLU - 1x1 conv (4 planes) - BN, plus the shortcut, then
/// ReLU. Expansion 4. Model parallel: the first 1x1 splits its output channels, the 3x3 its
/// input channels (all-reduced), the last 1x1 is replicated.
template <class T, mesh_type Mesh>
class bottleneck {
public:
    static constexpr std::size_t expansion = 4;

    bottleneck(const Mesh& mesh, std::size_t in, std::size_t planes, std::size_t stride,
               unsigned seed, const block_options& o = {})
        : conv1_(mesh, in, planes, 1, seed,
                 detail::conv_options<T, Mesh>(1, 0, channel_split::output, o))
        , bn1_(mesh, planes, detail::bn_options<T, Mesh>(true, o))
        , relu1_(mesh)
        , conv2_(mesh, planes, planes, 3, seed + 1,
                 detail::conv_options<T, Mesh>(stride, 1, channel_split::input, o))
        , bn2_(mesh, planes, detail::bn_options<T, Mesh>(false, o))
        , relu2_(mesh)
        , conv3_(mesh, planes, planes * expansion, 1, seed + 2,
                 detail::conv_options<T, Mesh>(1, 0, channel_split::none, o))
        , bn3_(mesh, planes * expansion, detail::bn_options<T, Mesh>(false, o))
        , shortcut_(mesh, in, planes * expansion, stride, seed + 3, o)
        , relu_(mesh) {}

    tensor<T, Mesh, 4> forward(const tensor<T, Mesh, 4>& x) {
        auto h = relu1_.forward(bn1_.forward(conv1_.forward(x)));
        h = relu2_.forward(bn2_.forward(conv2_.forward(h)));
        auto y = bn3_.forward(conv3_.forward(h));
        return relu_.forward(residual_add(std::move(y), shortcut_.forward(x)));
    }

    tensor<T, Mesh, 4> backward(const tensor<T, Mesh, 4>& dy) {
        const auto g = relu_.backward(dy);
        auto d = conv3_.backward(bn3_.backward(g));
        d = conv2_.backward(bn2_.backward(relu2_.backward(d)));
        auto dx = conv1_.backward(bn1_.backward(relu1_.backward(d)));
        return residual_add(std::move(dx), shortcut_.backward(g));
    }

    void train(bool on) {
        bn1_.train(on);
        bn2_.train(on);
        bn3_.train(on);
        shortcut_.train(on);
    }

    /// Bytes this rank's halo exchanges sent so far (spatial parallelism; 0 without).
    std::size_t halo_bytes_sent() const {
        return conv1_.halo_bytes_sent() + conv2_.halo_bytes_sent() + conv3_.halo_bytes_sent() +
               shortcut_.halo_bytes_sent();
    }

    friend void visit_parameters(bottleneck& b, auto&& visit) {
        visit("conv1", b.conv1_);
        visit("bn1", b.bn1_);
        visit("conv2", b.conv2_);
        visit("bn2", b.bn2_);
        visit("conv3", b.conv3_);
        visit("bn3", b.bn3_);
        b.shortcut_.visit(visit);
    }

private:
    conv2d<T, Mesh> conv1_;
    batch_norm2d<T, Mesh> bn1_;
    relu_activation<T, Mesh, 4> relu1_;
    conv2d<T, Mesh> conv2_;
    batch_norm2d<T, Mesh> bn2_;
    relu_activation<T, Mesh, 4> relu2_;
    conv2d<T, Mesh> conv3_;
    batch_norm2d<T, Mesh> bn3_;
    detail::shortcut<T, Mesh> shortcut_;
    relu_activation<T, Mesh, 4> relu_;
};

} // namespace xshard::nn
