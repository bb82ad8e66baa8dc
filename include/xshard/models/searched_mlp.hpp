#pragma once
/// \file
/// A multi-layer perceptron whose per-operator strategies are set at run time, by the search
/// engines (recursive_programming, sharding_propagation) through `auto_parallel::compile()` or
/// from an operator strategy file: the model the engines plug into.
///
///     xshard::searched_mlp<double, mesh_t> model(mesh, {784, 512, 512, 10}, 64, seed);
///     xshard::auto_parallel net(model, mesh, "recursive_programming");
///     xshard::trainer driver(net, loss, optimizer);  // compile(): search, then apply
///
/// Operators as search/networks.hpp's `mlp_network`: linear1, relu1, linear2, ..., on a mesh with
/// axes dp and tp. Each linear runs with its strategy's weight layout ([-, -], [-, tp] or
/// [tp, -]) on its input's split, adds its bias where the product has no pending sum (after
/// the reduction otherwise, as a row-parallel layer does), and redistributes its output to the
/// strategy's split; a relu redistributes its output likewise. The backward passes are the
/// adjoints (as nn/linear.hpp's layers). The input is [dp, -] rows; the output rows are split
/// over dp. Weights are drawn as nn/linear.hpp's (seed + i for linear i, the same on any mesh)
/// and `apply_strategy` moves them to new layouts keeping their values. A linear listed in
/// `searched_mlp_options::without_bias` has none (MindSpore's MatMulCell; the search prices
/// every linear with its bias, a difference of one row of the weight).

#include <xshard/core/op_choice.hpp>
#include <xshard/models/searched_model.hpp>
#include <xshard/models/searched_ops.hpp>
#include <xshard/nn/activation.hpp>
#include <xshard/nn/module.hpp>
#include <xshard/search/network_spec.hpp>
#include <xshard/search/networks.hpp>

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

/// A multi-layer perceptron whose operators' strategies are set at run time (see the file
/// comment); `spec()`, `choices()` and `apply_strategy` as every searched model's
/// (models/searched_model.hpp).
template <class T, mesh_type Mesh>
class searched_mlp : public detail::searched_model<searched_mlp<T, Mesh>> {
public:
    using tensor_type = nn::tensor<T, Mesh>;

    /// Widths {in, hidden..., out}, `batch` samples per step (what the search prices), weights
    /// from `seed`; every operator starts data parallel ([dp, -] rows, weights replicated).
    searched_mlp(const Mesh& mesh, std::vector<std::size_t> widths, std::size_t batch,
                 unsigned seed = 1, const searched_mlp_options& options = {})
        : detail::searched_model<searched_mlp>(mesh, mlp_network(widths, batch), "searched_mlp") {
        for (std::size_t i = 0; i + 1 < widths.size(); ++i)
            linears_.emplace_back(mesh, widths[i], widths[i + 1], seed + unsigned(i),
                                  !options.without_bias.contains(i + 1));
        for (std::size_t i = 0; i + 2 < widths.size(); ++i)
            relus_.emplace_back(mesh);
    }

    tensor_type forward(tensor_type x) {
        const auto& ops = this->spec().ops;
        for (std::size_t i = 0, l = 0, r = 0; i < ops.size(); ++i)
            x = ops[i].kind == op_kind::linear ? linears_[l++].forward(x) : relus_[r++].forward(x);
        return x;
    }

    tensor_type backward(tensor_type dy) {
        const auto& ops = this->spec().ops;
        std::size_t l = linears_.size(), r = relus_.size();
        for (std::size_t i = ops.size(); i-- > 0;)
            dy = ops[i].kind == op_kind::linear ? linears_[--l].backward(dy)
                                                : relus_[--r].backward(dy);
        return dy;
    }

    /// The operators, in the chain's order, as modules ("linear1", "relu1", "linear2", ...;
    /// the parameters "linear1.weight", "linear1.bias", ...): a pipeline cuts the chain
    /// between them (stage_starts from the search's plan).
    friend void visit_parameters(searched_mlp& m, auto&& visit) {
        for (std::size_t i = 0; i < m.linears_.size(); ++i) {
            visit("linear" + std::to_string(i + 1), m.linears_[i]);
            if (i < m.relus_.size())
                visit("relu" + std::to_string(i + 1), m.relus_[i]);
        }
    }

    /// Its operators are its modules, each a layer on tensor_type (see visit_parameters): a
    /// pipeline can run it (pipeline/pipeline.hpp).
    static constexpr bool operators_are_modules = true;

private:
    friend class detail::searched_model<searched_mlp>;
    using linear = detail::searched_linear<T, Mesh>;
    using relu = detail::redistributed_op<T, Mesh, nn::relu_activation<T, Mesh>>;

    /// Lays the operators out under the checked strategies `c` (apply_strategy).
    void lay_out(const std::vector<op_choice>& c) {
        const auto& ops = this->spec().ops;
        for (std::size_t i = 0, l = 0, r = 0; i < c.size(); ++i) {
            if (ops[i].kind == op_kind::linear)
                linears_[l++].set(c[i]);
            else
                relus_[r++].set(c[i]);
        }
    }

    std::vector<linear> linears_;
    std::vector<relu> relus_;
};

} // namespace xshard
