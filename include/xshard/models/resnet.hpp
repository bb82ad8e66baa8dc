#pragma once
/// \file
/// ResNet (He et al.) written as a traced function (graph/trace.hpp): no hand-written
/// backward, the computation of nn::resnet with its weight names (torchvision's: conv1,
/// bn1.gamma, layer1.0.conv1.weight, layer2.0.downsample.0.weight, fc.weight, ...), so the
/// weights of one load into the other.
///
///     auto logits = xshard::models::resnet(x, xshard::models::resnet18_depths, 10);
///
/// x is [N, 3, H, W]: a 7x7 stride-2 stem convolution, batch norm (the batch's statistics),
/// ReLU, 3x3 stride-2 max pooling, four stages of residual blocks (64, 128, 256, 512 planes,
/// stride 2 from the second stage on; basic blocks for ResNet-18/34, bottlenecks for
/// ResNet-50), global average pooling and a linear classifier. Without strategies every
/// operation is data parallel (the batch split over the dataset's axes); annotate nodes by
/// name (`program::shard`) for other splits. Each residual block is a scope ("layer1.0",
/// "layer2.1", ...), so blocks can be recomputed by name (compile_options::recompute).

#include <xshard/graph/trace.hpp>
#include <xshard/ops/conv.hpp>
#include <xshard/ops/elementwise.hpp>
#include <xshard/ops/matmul.hpp>
#include <xshard/ops/normalize.hpp>

#include <array>
#include <cstddef>
#include <string>

namespace xshard::models {

/// Blocks per stage.
inline constexpr std::array<std::size_t, 4> resnet18_depths{2, 2, 2, 2};
inline constexpr std::array<std::size_t, 4> resnet34_depths{3, 4, 6, 3};
inline constexpr std::array<std::size_t, 4> resnet50_depths{3, 4, 6, 3};

namespace detail {

/// conv (no bias, He-uniform weights) then batch norm, in the scopes `conv` and `bn` (their
/// nodes "<conv>.conv2d" and "<bn>.batch_norm", their weights "<conv>.weight", "<bn>.gamma").
inline traced_tensor conv_bn(const traced_tensor& x, const std::string& conv, const std::string& bn,
                             std::size_t in, std::size_t out, std::size_t kernel,
                             std::size_t stride, std::size_t padding) {
    traced_tensor y = x;
    {
        name_scope s(conv);
        y = ops::conv2d(x, param("weight", {out, in, kernel, kernel}),
                        {.stride = stride, .padding = padding});
    }
    name_scope s(bn);
    return ops::batch_norm(y, param("gamma", {out}, initializer::constant(1)),
                           param("beta", {out}, initializer::zeros()));
}

/// The shortcut: identity, or a 1x1 convolution (stride s) and batch norm.
inline traced_tensor shortcut(const traced_tensor& x, std::size_t in, std::size_t out,
                              std::size_t stride) {
    if (stride == 1 && in == out)
        return x;
    return conv_bn(x, "downsample.0", "downsample.1", in, out, 1, stride, 0);
}

/// The basic block, in the scope `name`: 3x3 conv (stride s) - BN - ReLU - 3x3 conv - BN,
/// plus the shortcut, ReLU.
inline traced_tensor basic_block(const traced_tensor& x, const std::string& name, std::size_t in,
                                 std::size_t planes, std::size_t stride) {
    name_scope s(name);
    auto y = ops::relu(conv_bn(x, "conv1", "bn1", in, planes, 3, stride, 1));
    y = conv_bn(y, "conv2", "bn2", planes, planes, 3, 1, 1);
    return ops::relu(ops::add(y, shortcut(x, in, planes, stride)));
}

/// The bottleneck, in the scope `name`: 1x1 conv - BN - ReLU - 3x3 conv (stride s) - BN -
/// ReLU - 1x1 conv (4 planes) - BN, plus the shortcut, ReLU.
inline traced_tensor bottleneck(const traced_tensor& x, const std::string& name, std::size_t in,
                                std::size_t planes, std::size_t stride) {
    name_scope s(name);
    auto y = ops::relu(conv_bn(x, "conv1", "bn1", in, planes, 1, 1, 0));
    y = ops::relu(conv_bn(y, "conv2", "bn2", planes, planes, 3, stride, 1));
    y = conv_bn(y, "conv3", "bn3", planes, 4 * planes, 1, 1, 0);
    return ops::relu(ops::add(y, shortcut(x, in, 4 * planes, stride)));
}

} // namespace detail

/// ResNet with `depths` blocks per stage (bottlenecks when `bottleneck`, as ResNet-50) on
/// x [N, 3, H, W]: the logits [N, classes] (see the file comment).
inline traced_tensor resnet(const traced_tensor& x, std::array<std::size_t, 4> depths,
                            std::size_t classes, bool bottleneck = false) {
    const std::size_t expansion = bottleneck ? 4 : 1;
    auto h = ops::relu(detail::conv_bn(x, "conv1", "bn1", 3, 64, 7, 2, 3));
    h = ops::max_pool2d(h, {.kernel = 3, .stride = 2, .padding = 1});
    std::size_t in = 64;
    for (std::size_t s = 0; s < 4; ++s) {
        const std::size_t planes = std::size_t(64) << s;
        for (std::size_t b = 0; b < depths[s]; ++b) {
            const std::string name = "layer" + std::to_string(s + 1) + "." + std::to_string(b);
            const std::size_t stride = b == 0 && s > 0 ? 2 : 1;
            h = bottleneck ? detail::bottleneck(h, name, in, planes, stride)
                           : detail::basic_block(h, name, in, planes, stride);
            in = planes * expansion;
        }
    }
    auto features = ops::global_avg_pool2d(h);
    auto w = param("fc.weight", {512 * expansion, classes});
    return ops::add(ops::matmul(features, w), param("fc.bias", {classes}, initializer::zeros()));
}

} // namespace xshard::models
