#pragma once
/// \file
/// A GPT-style decoder whose per-operator strategies are set at run time, by the search engines
/// (recursive_programming, sharding_propagation) through `auto_parallel::compile()` or from an
/// operator strategy file: the transformer the engines plug into, as models/searched_mlp.hpp
/// is the MLP.
///
///     xshard::searched_transformer<double, mesh_t> model(mesh, {.layers = 2, .hidden = 64,
///         .heads = 4, .sequence = 16, .vocabulary = 1000}, 8, seed);
///     xshard::auto_parallel net(model, mesh, "recursive_programming");
///     xshard::trainer driver(net, loss, optimizer);  // compile(): search, then apply
///
/// Operators as search/networks.hpp's `transformer_network`: embedding, then per block norm1,
/// qkv, attention, proj, norm2, up, gelu, down, then norm and head (no bias), each run by
/// models/searched_ops.hpp under its strategy, so that any chain the search can choose runs,
/// Megatron's (qkv and up split by columns, proj and down by rows) and sequence parallelism
/// ([(dp, tp), -] between operators) included. Each block is pre-norm with two residual
/// additions: h = x + proj(...), y = h + down(...); the residual is brought to the branch's
/// layout (the chain's next input) when the two differ, a redistribution the search does not
/// price (none where the residual and the branch keep one split, as the search's choices
/// usually do). Attention is causal, its heads split over tp where its input's features are.
///
/// The input is token ids [batch x sequence] (taken over dp); the output is the logits
/// [tokens, vocabulary], rows over dp, for parallel_cross_entropy with labels over dp. The
/// weights are drawn replicated from `seed` (the same on any mesh) and `apply_strategy` moves
/// them keeping their values, so every strategy computes what one rank computes.

#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/op_choice.hpp>
#include <xshard/models/searched_model.hpp>
#include <xshard/models/searched_ops.hpp>
#include <xshard/nn/activation.hpp>
#include <xshard/nn/layer_normalization.hpp>
#include <xshard/nn/module.hpp>
#include <xshard/search/network_spec.hpp>
#include <xshard/search/networks.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace xshard {

/// The sizes of a searched_transformer (as `transformer_network`'s arguments).
struct transformer_sizes {
    std::size_t layers = 1;
    std::size_t hidden = 64;
    std::size_t heads = 1;
    std::size_t sequence = 16;
    std::size_t vocabulary = 1000;
};

/// A GPT-style decoder whose operators' strategies are set at run time (see the file
/// comment); `spec()`, `choices()` and `apply_strategy` as every searched model's
/// (models/searched_model.hpp).
template <class T, mesh_type Mesh>
class searched_transformer : public detail::searched_model<searched_transformer<T, Mesh>> {
public:
    using tensor_type = nn::tensor<T, Mesh>;
    using ids_type = nn::tensor<std::int64_t, Mesh, 1>;

    /// `batch` sequences per step (what the search prices); every operator starts data
    /// parallel ([dp, -] rows, weights replicated). Throws xshard::error for sizes
    /// transformer_network refuses or a mesh without axes dp and tp.
    searched_transformer(const Mesh& mesh, const transformer_sizes& sizes, std::size_t batch,
                         unsigned seed = 1)
        : detail::searched_model<searched_transformer>(mesh, network(sizes, batch),
                                                       "searched_transformer")
        , embedding_(mesh, sizes.vocabulary, sizes.hidden, seed)
        , norm_(mesh, sizes.hidden)
        , head_(mesh, sizes.hidden, sizes.vocabulary, seed + 1 + 4 * unsigned(sizes.layers),
                false) {
        blocks_.reserve(sizes.layers);
        for (std::size_t l = 0; l < sizes.layers; ++l)
            blocks_.emplace_back(mesh, sizes, seed + 1 + 4 * unsigned(l));
    }

    /// The logits of token ids [batch x sequence]. Collective over the mesh.
    tensor_type forward(const ids_type& ids) {
        auto x = embedding_.forward(ids);
        for (auto& b : blocks_)
            x = b.forward(x);
        return head_.forward(norm_.forward(x));
    }

    /// Adds the weights' gradients from the logits' gradient `dy`; the ids have none.
    void backward(const tensor_type& dy) {
        auto d = norm_.backward(head_.backward(dy));
        for (std::size_t l = blocks_.size(); l-- > 0;)
            d = blocks_[l].backward(d);
        embedding_.backward(d);
    }

    friend void visit_parameters(searched_transformer& m, auto&& visit) {
        visit("embedding", m.embedding_);
        for (std::size_t l = 0; l < m.blocks_.size(); ++l)
            m.blocks_[l].visit("block" + std::to_string(l), visit);
        visit("norm", m.norm_);
        visit("head", m.head_);
    }

private:
    friend class detail::searched_model<searched_transformer>;
    using linear = detail::searched_linear<T, Mesh>;
    using norm = detail::redistributed_op<T, Mesh, nn::layer_normalization<T, Mesh>>;

    /// Lays the operators out under the checked strategies `c` (apply_strategy).
    void lay_out(const std::vector<op_choice>& c) {
        embedding_.set(c[0]);
        for (std::size_t l = 0; l < blocks_.size(); ++l)
            blocks_[l].set(&c[1 + 8 * l]);
        norm_.set(c[c.size() - 2]);
        head_.set(c.back());
    }

    static network_spec network(const transformer_sizes& s, std::size_t batch) {
        try {
            return transformer_network(s.layers, s.hidden, s.heads, s.sequence, s.vocabulary,
                                       batch);
        } catch (const std::invalid_argument& e) {
            throw error(std::string("xshard: searched_transformer: ") + e.what());
        }
    }

    /// One pre-norm block: operators 1 + 8 l ... 8 + 8 l of the chain.
    struct block {
        norm norm1;
        linear qkv;
        detail::redistributed_op<T, Mesh, detail::attention_core<T, Mesh>> attention;
        linear proj;
        norm norm2;
        linear up;
        detail::redistributed_op<T, Mesh, nn::gelu_activation<T, Mesh>> gelu;
        linear down;
        nn::kept_redistribution<T, Mesh> skip1, skip2;
        layout x_layout, h_layout;

        block(const Mesh& mesh, const transformer_sizes& s, unsigned seed)
            : norm1(mesh, s.hidden)
            , qkv(mesh, s.hidden, 3 * s.hidden, seed, true)
            , attention(mesh, s.hidden, s.heads, s.sequence)
            , proj(mesh, s.hidden, s.hidden, seed + 1, true)
            , norm2(mesh, s.hidden)
            , up(mesh, s.hidden, 4 * s.hidden, seed + 2, true)
            , gelu(mesh)
            , down(mesh, 4 * s.hidden, s.hidden, seed + 3, true) {}

        void set(const op_choice* c) {
            norm1.set(c[0]);
            qkv.set(c[1]);
            attention.set(c[2]);
            proj.set(c[3]);
            norm2.set(c[4]);
            up.set(c[5]);
            gelu.set(c[6]);
            down.set(c[7]);
        }

        tensor_type forward(const tensor_type& x) {
            x_layout = x.layout();
            auto a = proj.forward(attention.forward(qkv.forward(norm1.forward(x))));
            auto h = xshard::ops::add(skip1(x, a.layout()), a);
            h_layout = h.layout();
            auto m = down.forward(gelu.forward(up.forward(norm2.forward(h))));
            return xshard::ops::add(skip2(h, m.layout()), m);
        }

        tensor_type backward(const tensor_type& dy) {
            auto dh = norm2.backward(up.backward(gelu.backward(down.backward(dy))));
            dh = xshard::ops::add(dh, skip2.adjoint(dy, h_layout));
            auto dx = norm1.backward(qkv.backward(attention.backward(proj.backward(dh))));
            return xshard::ops::add(dx, skip1.adjoint(dh, x_layout));
        }

        void visit(const std::string& name, auto&& f) {
            f(name + ".norm1", norm1);
            f(name + ".qkv", qkv);
            f(name + ".proj", proj);
            f(name + ".norm2", norm2);
            f(name + ".up", up);
            f(name + ".down", down);
        }
    };

    detail::searched_embedding<T, Mesh> embedding_;
    std::vector<block> blocks_;
    norm norm_;
    linear head_;
};

} // namespace xshard
