#pragma once
/// \file
/// A multi-layer perceptron whose per-operator strategies are set at run time, by the search
/// engines (recursive_programming, sharding_propagation) through `auto_parallel::compile()` or
/// from an operator strategy file: the model the engines plug into.
///
///     xshard::searched_mlp<double, mesh_t> model(mesh, {784, 512, 512, 10}, 64, seed);
///     xshard::auto_parallel net(model, mesh, "recursive_programming");
///     xshard::model trainer(net, loss, optimizer);   // compile(): search, then apply
///
/// Operators as auto/cost.hpp's `mlp_network`: linear1, relu1, linear2, ..., on a mesh with
/// axes dp and tp. Each linear runs with its strategy's weight layout ([-, -], [-, tp] or
/// [tp, -]) on its input's split, adds its bias where the product has no pending sum (after
/// the reduction otherwise, as a row-parallel layer does), and redistributes its output to the
/// strategy's split; a relu redistributes its output likewise. The backward passes are the
/// adjoints (as nn/linear.hpp's layers). The input is [dp, -] rows; the output rows are split
/// over dp. Weights are drawn as nn/linear.hpp's (seed + i for linear i, the same on any mesh)
/// and `apply_strategy` moves them to new layouts keeping their values. A linear listed in
/// `searched_mlp_options::without_bias` has none (MindSpore's MatMulCell; the search prices
/// every linear with its bias, a difference of one row of the weight).

#include <xshard/auto/cost.hpp>
#include <xshard/nn/activation.hpp>
#include <xshard/nn/linear.hpp>
#include <xshard/nn/module.hpp>

#include <cstddef>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace xshard {

/// The options of a searched_mlp.
struct searched_mlp_options {
    /// The linears without a bias, numbered from 1 as their names ("linear1", ...).
    std::set<std::size_t> without_bias = {};
};

template <class T, mesh_type Mesh>
class searched_mlp {
public:
    using tensor_type = nn::tensor<T, Mesh>;

    /// Widths {in, hidden..., out}, `batch` samples per step (what the search prices), weights
    /// from `seed`; every operator starts data parallel ([dp, -] rows, weights replicated).
    searched_mlp(const Mesh& mesh, std::vector<std::size_t> widths, std::size_t batch,
                 unsigned seed = 1, const searched_mlp_options& options = {})
        : mesh_(mesh)
        , spec_(mlp_network(widths, batch)) {
        if (!mesh.has_axis("dp") || !mesh.has_axis("tp"))
            throw error("xshard: searched_mlp: the mesh " + mesh.shape().to_string() +
                        " needs axes dp and tp");
        for (std::size_t i = 0; i + 1 < widths.size(); ++i)
            linears_.emplace_back(mesh, widths[i], widths[i + 1], seed + unsigned(i),
                                  !options.without_bias.contains(i + 1));
        for (std::size_t i = 0; i + 2 < widths.size(); ++i)
            relus_.emplace_back(mesh);
        choices_.assign(spec_.ops.size(), {});
    }

    /// The network the search prices.
    const network_spec& spec() const noexcept { return spec_; }
    /// The strategies in use, one per operator.
    const std::vector<op_choice>& choices() const noexcept { return choices_; }

    /// Sets every operator's strategy (one per operator of `spec()`), moving the weights to
    /// their new layouts (their values kept; gradients zeroed, optimizer state dropped).
    /// Throws xshard::error, on every rank alike, for a strategy that does not suit its
    /// operator or a chain whose neighbours do not meet. Collective over the mesh.
    void apply_strategy(const std::vector<op_choice>& c) {
        if (c.size() != spec_.ops.size())
            throw error("xshard: searched_mlp: " + std::to_string(c.size()) + " strategies for " +
                        std::to_string(spec_.ops.size()) + " operators");
        const auto& ms = mesh_.shape();
        const int dp = ms.axis_size("dp"), tp = ms.axis_size("tp");
        for (std::size_t i = 0; i < c.size(); ++i) {
            const auto& op = spec_.ops[i];
            const auto options = op_options(op, c[i].in, dp, tp, spec_.batch);
            bool ok = false;
            for (const auto& o : options)
                ok = ok || o.first == c[i].weight;
            const auto expected = i == 0 ? activation_split::rows : c[i - 1].out;
            if (!ok || c[i].in != expected)
                throw error("xshard: searched_mlp: operator " + op.name + " cannot run with in " +
                            std::string(to_string(c[i].in)) + ", weight " +
                            std::string(to_string(c[i].weight)) + " after " +
                            std::string(to_string(expected)));
        }
        if (c.back().out == activation_split::all_rows)
            throw error("xshard: searched_mlp: the output must keep its rows over dp (the "
                        "labels' split), not " +
                        std::string(to_string(c.back().out)));
        choices_ = c;
        for (std::size_t i = 0, l = 0, r = 0; i < c.size(); ++i) {
            if (spec_.ops[i].kind == op_kind::linear)
                linears_[l++].set(c[i]);
            else
                relus_[r++].out = activation_layout(c[i].out);
        }
    }

    tensor_type forward(tensor_type x) {
        for (std::size_t i = 0, l = 0, r = 0; i < spec_.ops.size(); ++i)
            x = spec_.ops[i].kind == op_kind::linear ? linears_[l++].forward(x)
                                                     : relus_[r++].forward(x);
        return x;
    }

    tensor_type backward(tensor_type dy) {
        std::size_t l = linears_.size(), r = relus_.size();
        for (std::size_t i = spec_.ops.size(); i-- > 0;)
            dy = spec_.ops[i].kind == op_kind::linear ? linears_[--l].backward(dy)
                                                      : relus_[--r].backward(dy);
        return dy;
    }

    friend void visit_parameters(searched_mlp& m, auto&& visit) {
        for (std::size_t i = 0; i < m.linears_.size(); ++i) {
            visit("linear" + std::to_string(i + 1) + ".weight", m.linears_[i].w);
            if (m.linears_[i].b)
                visit("linear" + std::to_string(i + 1) + ".bias", *m.linears_[i].b);
        }
    }

private:
    struct linear {
        weight<nn::tensor<T, Mesh, 2>> w;
        std::optional<weight<nn::tensor<T, Mesh, 1>>> b;
        layout out = activation_layout(activation_split::rows);
        std::optional<tensor_type> x;
        layout z_layout;
        bool reduce_first = false;
        nn::kept_redistribution<T, Mesh> redistribute, adjoint, to_input_gradient;
        nn::kept_redistribution<T, Mesh, 1> to_bias_terms;

        linear(const Mesh& mesh, std::size_t in, std::size_t outs, unsigned seed, bool bias)
            : w(nn::make_weight<T>(mesh, std::array{in, outs},
                                   weight_layout(weight_split::replicated), seed,
                                   std::uniform_real_distribution<T>(-T(1) / std::sqrt(T(in)),
                                                                     T(1) / std::sqrt(T(in))))) {
            if (bias)
                b.emplace(nn::constant_weight<T>(mesh, std::array{outs},
                                                 bias_layout(weight_split::replicated), T(0)));
        }

        void set(const op_choice& c) {
            const auto wl = weight_layout(c.weight), bl = bias_layout(c.weight);
            if (!(w.value.layout() == wl))
                w = weight<nn::tensor<T, Mesh, 2>>(
                    xshard::redistribute<dynamic_layout(2)>(w.value, wl));
            if (b && !(b->value.layout() == bl))
                b = weight<nn::tensor<T, Mesh, 1>>(
                    xshard::redistribute<dynamic_layout(1)>(b->value, bl));
            out = activation_layout(c.out);
        }

        tensor_type forward(const tensor_type& in) {
            x = in;
            auto z = xshard::ops::matmul(in, w.value);
            z_layout = z.layout();
            reduce_first = z.layout().is_partial();
            if (!b)
                return redistribute(std::move(z), out);
            if (reduce_first)
                return xshard::ops::add(redistribute(std::move(z), out), b->value);
            return redistribute(xshard::ops::add(z, b->value), out);
        }

        tensor_type backward(const tensor_type& dy) {
            const auto g = adjoint.adjoint(dy, z_layout);
            if (b)
                nn::accumulate(*b, xshard::ops::sum<0>(reduce_first ? dy : g), to_bias_terms);
            nn::accumulate_product(w, xshard::ops::transposed(*x), g);
            // dx laid out as x's gradient (the dual of x's layout), as nn's layers do.
            return to_input_gradient(xshard::ops::matmul(g, xshard::ops::transposed(w.value)),
                                     dual(x->layout(), x->mesh().shape()));
        }
    };

    struct relu {
        nn::relu_activation<T, Mesh> f{};
        layout out = activation_layout(activation_split::rows);
        layout y_layout;
        nn::kept_redistribution<T, Mesh> redistribute, adjoint;

        explicit relu(const Mesh& mesh)
            : f(mesh) {}

        tensor_type forward(const tensor_type& x) {
            auto y = f.forward(x);
            y_layout = y.layout();
            return redistribute(std::move(y), out);
        }
        tensor_type backward(const tensor_type& dy) {
            return f.backward(adjoint.adjoint(dy, y_layout));
        }
    };

    Mesh mesh_;
    network_spec spec_;
    std::vector<linear> linears_;
    std::vector<relu> relus_;
    std::vector<op_choice> choices_;
};

} // namespace xshard
