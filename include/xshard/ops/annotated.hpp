#pragma once
/// \file
/// Operations on traced tensors, and MindSpore's per-operator `.shard(...)`.
///
/// The operations of `xshard::ops` also take *traced* tensors, the symbolic tensors a program
/// is recorded with (graph/trace.hpp). On them an operation records a node, by its name with
/// its attributes and annotation, instead of computing: it calls `trace_call`, found by
/// argument-dependent lookup on the traced tensor's type, so ops/ knows nothing of programs.
///
/// `op.shard(strategies)` annotates one use of an operation, as MindSpore's
/// `ops.MatMul().shard(((2, 4), (4, 1)))`:
///
///     auto h = xshard::ops::matmul.shard({{2, 4}, {4, 1}})(x, w);
///     auto y = xshard::ops::relu.shard({{4, 1}})(h);
///     auto z = xshard::ops::matmul.shard({"[dp, mp]", "[mp, -]"}, {"[dp, -]"})(x, w);
///
/// one strategy per operand, or one layout per operand and optionally one per result (the
/// result is redistributed to it, MindSpore's out_strategy). Compiling the program onto a
/// mesh (graph/compile.hpp) lays the operands out so; the strategies are checked there,
/// against the mesh.

#include <xshard/core/annotation.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/strategy.hpp>

#include <initializer_list>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard::ops {

/// A symbolic tensor of a program being traced: operations on it record a node.
template <class A>
concept traced_operand = requires { requires std::remove_cvref_t<A>::is_traced; };

/// An operation with a `.shard(...)` annotation, for one use in a traced program.
class annotated {
public:
    /// Operation `op` annotated with `a`, recorded with attributes `at` (a window's size,
    /// a convolution's stride: ops/conv.hpp).
    annotated(std::string_view op, op_annotation a, op_attributes at = {})
        : op_(op)
        , annotation_(std::move(a))
        , attributes_(std::move(at)) {}

    /// Records the operation on traced operands with the annotation.
    template <traced_operand... A>
    auto operator()(const A&... operands) const {
        return trace_call(op_, attributes_, annotation_, operands...);
    }

    /// The annotation.
    const op_annotation& annotation() const noexcept { return annotation_; }

private:
    std::string_view op_;
    op_annotation annotation_;
    op_attributes attributes_;
};

/// Gives an operation function object `.shard(...)` (Derived has a `name`).
template <class Derived>
struct shardable {
    /// One MindSpore strategy per operand.
    annotated shard(std::initializer_list<strategy> in) const {
        return annotated(self().name, op_annotation{std::vector<strategy>(in), {}, {}});
    }
    annotated shard(std::vector<strategy> in) const {
        return annotated(self().name, op_annotation{std::move(in), {}, {}});
    }
    /// One layout per operand, and optionally one per result.
    annotated shard(std::initializer_list<layout> in, std::initializer_list<layout> out = {}) const {
        return annotated(self().name,
                         op_annotation{{}, std::vector<layout>(in), std::vector<layout>(out)});
    }

private:
    const Derived& self() const { return static_cast<const Derived&>(*this); }
};

} // namespace xshard::ops
