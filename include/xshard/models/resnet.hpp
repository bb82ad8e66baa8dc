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

#include <xshard/compiled.hpp>
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
XSHARD_DECL traced_tensor conv_bn(const traced_tensor& x, const std::string& conv,
                                  const std::string& bn, std::size_t in, std::size_t out,
                                  std::size_t kernel, std::size_t stride, std::size_t padding);

/// The shortcut: identity, or a 1x1 convolution (stride s) and batch norm.
XSHARD_DECL traced_tensor shortcut(const traced_tensor& x, std::size_t in, std::size_t out,
                                   std::size_t stride);

/// The basic block, in the scope `name`: 3x3 conv (stride s) - BN - ReLU - 3x3 conv - BN,
/// plus the shortcut, ReLU.
XSHARD_DECL traced_tensor basic_block(const traced_tensor& x, const std::string& name,
                                      std::size_t in, std::size_t planes, std::size_t stride);

/// The bottleneck, in the scope `name`: 1x1 conv - BN - ReLU - 3x3 conv (stride s) - BN -
/// ReLU - 1x1 conv (4 planes) - BN, plus the shortcut, ReLU.
XSHARD_DECL traced_tensor bottleneck(const traced_tensor& x, const std::string& name,
                                     std::size_t in, std::size_t planes, std::size_t stride);

} // namespace detail

/// ResNet with `depths` blocks per stage (bottlenecks when `bottleneck`, as ResNet-50) on
/// x [N, 3, H, W]: the logits [N, classes] (see the file comment).
XSHARD_DECL traced_tensor resnet(const traced_tensor& x, std::array<std::size_t, 4> depths,
                                 std::size_t classes, bool bottleneck = false);

} // namespace xshard::models

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/models/resnet.ipp>
#endif
