#pragma once
/// \file
/// A program: the operator graph that one run of a user's network on symbolic inputs
/// records (graph/trace.hpp), MindSpore's graph-mode IR and JAX's jaxpr for xshard.
///
/// Values are the program's inputs, its weights (named graph inputs with an initializer)
/// and the results of its nodes. A node is one operation of `xshard::ops` (by its primitive
/// name, graph/primitive.hpp) with its attributes, its operand and result values, a
/// hierarchical name from the module path ("backbone.layer1.matmul") and optionally a
/// strategy. Nodes are in the order they were recorded, which is an order in which every
/// operand is computed before its use. A program holds shapes and no data: compiling it onto
/// a mesh (graph/compile.hpp) gives every value a layout and makes it runnable.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/annotation.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/strategy.hpp>
#include <xshard/param/initializer.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace xshard {

/// The element type of a program value.
enum class dtype : std::uint8_t { f32, f64, i64 };

/// The dtype of C++ type T (float, double, or an integer type for labels and ids).
template <class T>
constexpr dtype dtype_for() {
    if constexpr (std::is_same_v<T, float>)
        return dtype::f32;
    else if constexpr (std::is_same_v<T, double>)
        return dtype::f64;
    else {
        static_assert(std::is_integral_v<T>,
                      "xshard: a program value is float, double or an integer type");
        return dtype::i64;
    }
}

/// "f32", "f64" or "i64".
constexpr std::string_view to_string(dtype t) {
    return t == dtype::f32 ? "f32" : t == dtype::f64 ? "f64" : "i64";
}

namespace detail {

/// Bytes of one element of `t`.
inline std::size_t element_bytes(dtype t) {
    return t == dtype::f32 ? 4 : 8;
}

} // namespace detail

/// The global shape of a program value.
using value_shape = std::vector<std::size_t>;

/// "(64, 784)".
XSHARD_DECL std::string shape_text(const value_shape& s);

/// The user's own operation behind a custom-VJP node (graph/custom.hpp).
struct custom_op_base;

/// What a program value is.
enum class value_kind : std::uint8_t {
    input,  ///< an argument of the program (data, labels)
    weight, ///< a trainable parameter, named, with an initializer
    result, ///< the result of a node
};

/// One value of a program.
struct program_value {
    value_kind kind = value_kind::result;
    value_shape shape;
    dtype type = dtype::f64;
    /// Inputs and weights: their dotted name. Results: empty (named by their node).
    std::string name;
    /// Results: the node that computes it, and which of its results it is.
    std::size_t node = 0;
    std::size_t result_index = 0;
    /// Weights: how the values are drawn (param/initializer.hpp).
    initializer init = initializer::zeros();
};

/// One operation of a program.
struct program_node {
    std::string op;   ///< the primitive's name ("matmul", "relu", ...)
    std::string name; ///< hierarchical, unique in the program ("layer1.matmul")
    op_attributes attributes;
    std::vector<std::size_t> operands; ///< value ids
    std::vector<std::size_t> results;  ///< value ids
    op_annotation annotation;
    /// Custom-VJP nodes: the user's forward and backward (op is "custom").
    std::shared_ptr<const custom_op_base> custom;
};

/// A traced program (see the file comment).
class program {
public:
    /// The values, by id.
    const std::vector<program_value>& values() const noexcept { return values_; }
    const program_value& value(std::size_t id) const { return values_.at(id); }
    /// The nodes, in an order where every operand comes before its use.
    const std::vector<program_node>& nodes() const noexcept { return nodes_; }
    /// The ids of the inputs, in the order of the traced function's parameters.
    const std::vector<std::size_t>& inputs() const noexcept { return inputs_; }
    /// The ids of the weights, in the order they were first used.
    const std::vector<std::size_t>& weights() const noexcept { return weights_; }
    /// The ids of the outputs, in the order the traced function returned them.
    const std::vector<std::size_t>& outputs() const noexcept { return outputs_; }

    /// The node named `name`; throws xshard::error naming it (and the nearest names) when
    /// there is none.
    program_node& node(std::string_view name) { return nodes_[node_index(name)]; }
    const program_node& node(std::string_view name) const { return nodes_[node_index(name)]; }

    /// Annotates the node named `name` with MindSpore's per-operator strategy (one strategy
    /// per operand), as `ops::matmul.shard({{2, 4}, {4, 1}})` would where it is written.
    /// Checked against the operands' ranks here, and against the mesh when compiled.
    program& shard(std::string_view name, std::vector<strategy> in_strategies);

    /// The value's display name: an input's or weight's name, "node" or "node:i" for results.
    std::string value_name(std::size_t id) const;

    /// The listing: inputs, weights, then one line per node (name, operation, operands,
    /// result shapes, strategy), then the outputs.
    friend std::ostream& operator<<(std::ostream& os, const program& p) {
        for (auto id : p.inputs_)
            os << "input  " << p.values_[id].name << ": " << to_string(p.values_[id].type)
               << shape_text(p.values_[id].shape) << "\n";
        for (auto id : p.weights_)
            os << "weight " << p.values_[id].name << ": " << to_string(p.values_[id].type)
               << shape_text(p.values_[id].shape) << "\n";
        for (const auto& n : p.nodes_) {
            os << n.name << " = " << n.op << "(";
            for (std::size_t i = 0; i < n.operands.size(); ++i)
                os << (i ? ", " : "") << p.value_name(n.operands[i]);
            os << ")";
            for (auto r : n.results)
                os << " -> " << to_string(p.values_[r].type) << shape_text(p.values_[r].shape);
            if (!n.annotation.empty())
                os << " shard " << n.annotation.to_string();
            os << "\n";
        }
        os << "output";
        for (auto id : p.outputs_)
            os << " " << p.value_name(id);
        return os << "\n";
    }

    // Recording (graph/trace.hpp).

    /// Adds an input or a weight; returns its id.
    std::size_t add_argument(value_kind kind, std::string name, value_shape shape, dtype type,
                             initializer init = initializer::zeros());

    /// Adds a node with results of the given shapes and types; returns its index.
    std::size_t add_node(program_node n, const std::vector<std::pair<value_shape, dtype>>& results);

    /// Marks `id` as the next output.
    void add_output(std::size_t id) { outputs_.push_back(id); }

    /// The weight named `name`, if there is one.
    std::optional<std::size_t> weight_named(std::string_view name) const;

private:
    std::size_t node_index(std::string_view name) const;

    std::vector<program_value> values_;
    std::vector<program_node> nodes_;
    std::vector<std::size_t> inputs_, weights_, outputs_;
};

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/graph/program.ipp>
#endif
