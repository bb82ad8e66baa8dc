#pragma once
/// \file
/// The definitions of what models/resnet.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/models/resnet.hpp>

namespace xshard::models {

namespace detail {

XSHARD_DECL traced_tensor conv_bn(const traced_tensor& x, const std::string& conv,
                                  const std::string& bn, std::size_t in, std::size_t out,
                                  std::size_t kernel, std::size_t stride, std::size_t padding) {
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

XSHARD_DECL traced_tensor shortcut(const traced_tensor& x, std::size_t in, std::size_t out,
                                   std::size_t stride) {
    if (stride == 1 && in == out)
        return x;
    return conv_bn(x, "downsample.0", "downsample.1", in, out, 1, stride, 0);
}

XSHARD_DECL traced_tensor basic_block(const traced_tensor& x, const std::string& name,
                                      std::size_t in, std::size_t planes, std::size_t stride) {
    name_scope s(name);
    auto y = ops::relu(conv_bn(x, "conv1", "bn1", in, planes, 3, stride, 1));
    y = conv_bn(y, "conv2", "bn2", planes, planes, 3, 1, 1);
    return ops::relu(ops::add(y, shortcut(x, in, planes, stride)));
}

XSHARD_DECL traced_tensor bottleneck(const traced_tensor& x, const std::string& name,
                                     std::size_t in, std::size_t planes, std::size_t stride) {
    name_scope s(name);
    auto y = ops::relu(conv_bn(x, "conv1", "bn1", in, planes, 1, 1, 0));
    y = ops::relu(conv_bn(y, "conv2", "bn2", planes, planes, 3, stride, 1));
    y = conv_bn(y, "conv3", "bn3", planes, 4 * planes, 1, 1, 0);
    return ops::relu(ops::add(y, shortcut(x, in, 4 * planes, stride)));
}

} // namespace detail

XSHARD_DECL traced_tensor resnet(const traced_tensor& x, std::array<std::size_t, 4> depths,
                                 std::size_t classes, bool bottleneck) {
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

