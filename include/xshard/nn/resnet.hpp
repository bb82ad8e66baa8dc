#pragma once
/// \file
/// ResNet (He et al.; MindSpore's model zoo resnet.py): a 7x7 stride-2 stem convolution,
/// batch norm, ReLU, 3x3 stride-2 max pooling, four stages of residual blocks (64, 128, 256,
/// 512 planes, stride 2 from the second stage on), global average pooling and a linear
/// classifier. `resnet18(mesh, classes)` (basic blocks 2-2-2-2) and `resnet50(mesh,
/// classes)` (bottlenecks 3-4-6-3) build it.
///
/// Parallel layouts (`resnet_options`): the input's batch split is kept through the network
/// (data parallelism over the batch's axes); `blocks.model_parallel` splits every block's
/// inner channels over `blocks.axis` (see resnet_blocks.hpp); `classifier_parallel` splits
/// the classifier's classes over that axis and all-gathers the logits. An input whose height
/// and/or width is split (spatial parallelism, `[dp, -, sp, -]`) keeps that split through
/// every block (halo exchanges in the convolutions and the max pooling, batch norm sums
/// all-reduced over the bands) down to the global pooling, whose features come out
/// replicated over the spatial axes; the image size must leave every stage's bands at least
/// as thick as their halos (ResNet-18 on 16 x 16 images: 2 bands, not 4), else the first
/// layer that cannot serve them raises a sentence on every rank.

#include <xshard/nn/global_pooling.hpp>
#include <xshard/nn/linear.hpp>
#include <xshard/nn/pooling.hpp>
#include <xshard/nn/resnet_blocks.hpp>

#include <string>
#include <vector>

namespace xshard::nn {

/// How a ResNet is built and laid out.
struct resnet_options {
    block_options blocks = {};
    bool classifier_parallel = false; ///< split the classifier's classes over blocks.axis
    unsigned seed = 1;                ///< weights: the same on any mesh for one seed
};

/// A ResNet of blocks `Block` (basic_block or bottleneck): see the file comment.
template <class T, mesh_type Mesh, template <class, class> class Block>
class resnet {
public:
    using block_type = Block<T, Mesh>;

    resnet(const Mesh& mesh, std::array<std::size_t, 4> depths, std::size_t num_classes,
           resnet_options o = {})
        : conv1_(mesh, 3, 64, 7, o.seed,
                 typename conv2d<T, Mesh>::options{.stride = 2, .padding = 3})
        , bn1_(mesh, 64, typename batch_norm2d<T, Mesh>::options{.sync = o.blocks.sync_bn})
        , relu_(mesh)
        , pool_(mesh, pool_options{.kernel = 3, .stride = 2, .padding = 1})
        , gap_(mesh)
        , fc_(mesh, 512 * block_type::expansion, num_classes, o.seed + 9999,
              {.axes = {o.classifier_parallel ? o.blocks.axis : std::string()},
               .bias = true,
               .gather_output = o.classifier_parallel}) {
        std::size_t in = 64;
        unsigned seed = o.seed + 10;
        for (std::size_t s = 0; s < 4; ++s) {
            const std::size_t planes = std::size_t(64) << s;
            for (std::size_t b = 0; b < depths[s]; ++b) {
                blocks_.emplace_back(mesh, in, planes, b == 0 && s > 0 ? 2 : 1, seed, o.blocks);
                stage_of_.push_back(s);
                seed += 10;
                in = planes * block_type::expansion;
            }
        }
    }

    /// x [N, 3, H, W] -> logits [N, num_classes] (the batch laid out as x's).
    tensor<T, Mesh> forward(const tensor<T, Mesh, 4>& x) { return fc_.forward(features(x)); }

    /// The gradient of the logits -> that of the input; weights' gradients added.
    tensor<T, Mesh, 4> backward(const tensor<T, Mesh>& dlogits) {
        return backward_features(fc_.backward(dlogits));
    }

    /// The network without its classifier: x -> the pooled features [N, 512 expansion] (for
    /// a head of one's own, e.g. MindSpore's hybrid mode); `backward_features` is its adjoint.
    tensor<T, Mesh> features(const tensor<T, Mesh, 4>& x) {
        auto h = pool_.forward(relu_.forward(bn1_.forward(conv1_.forward(x))));
        for (auto& b : blocks_)
            h = b.forward(h);
        return gap_.forward(h);
    }
    tensor<T, Mesh, 4> backward_features(const tensor<T, Mesh>& dfeatures) {
        auto d = gap_.backward(dfeatures);
        for (auto b = blocks_.rbegin(); b != blocks_.rend(); ++b)
            d = b->backward(d);
        return conv1_.backward(bn1_.backward(relu_.backward(pool_.backward(d))));
    }

    /// Training (batch statistics) or evaluation (running statistics) for every batch norm.
    void train(bool on) {
        bn1_.train(on);
        for (auto& b : blocks_)
            b.train(on);
    }

    /// Bytes this rank's halo exchanges sent so far, every convolution and the max pooling
    /// (spatial parallelism; 0 without).
    std::size_t halo_bytes_sent() const {
        std::size_t n = conv1_.halo_bytes_sent() + pool_.halo_bytes_sent();
        for (const auto& b : blocks_)
            n += b.halo_bytes_sent();
        return n;
    }

    /// Names as torchvision's: conv1, bn1, layer1.0.conv1, ..., fc.weight.
    friend void visit_parameters(resnet& r, auto&& visit) {
        visit("conv1", r.conv1_);
        visit("bn1", r.bn1_);
        std::size_t i = 0, previous = 99, index = 0;
        for (auto& b : r.blocks_) {
            const std::size_t s = r.stage_of_[i++];
            index = s == previous ? index + 1 : 0;
            previous = s;
            visit("layer" + std::to_string(s + 1) + "." + std::to_string(index), b);
        }
        visit("fc", r.fc_);
    }

private:
    conv2d<T, Mesh> conv1_;
    batch_norm2d<T, Mesh> bn1_;
    relu_activation<T, Mesh, 4> relu_;
    max_pool2d<T, Mesh> pool_;
    std::vector<block_type> blocks_;
    std::vector<std::size_t> stage_of_;
    global_avg_pool2d<T, Mesh> gap_;
    column_parallel_linear<T, Mesh> fc_;
};

/// ResNet-18: basic blocks 2-2-2-2 (11.7 M parameters at 1000 classes).
template <class T, mesh_type Mesh>
resnet<T, Mesh, basic_block> resnet18(const Mesh& mesh, std::size_t num_classes,
                                      resnet_options o = {}) {
    return resnet<T, Mesh, basic_block>(mesh, {2, 2, 2, 2}, num_classes, std::move(o));
}

/// ResNet-50: bottlenecks 3-4-6-3 (25.6 M parameters at 1000 classes), the tutorial's.
template <class T, mesh_type Mesh>
resnet<T, Mesh, bottleneck> resnet50(const Mesh& mesh, std::size_t num_classes,
                                     resnet_options o = {}) {
    return resnet<T, Mesh, bottleneck>(mesh, {3, 4, 6, 3}, num_classes, std::move(o));
}

} // namespace xshard::nn
