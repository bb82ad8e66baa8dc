#pragma once
/// \file
/// Tracing: running a user's network once on symbolic tensors records its program.
///
///     auto net = [](xshard::traced_tensor x) {
///         xshard::name_scope s("dense1");
///         auto w = xshard::param("weight", {784, 512}, xshard::initializer::normal(0, 0.05));
///         return xshard::ops::relu(xshard::ops::matmul.shard({{2, 4}, {4, 1}})(x, w));
///     };
///     xshard::program p = xshard::trace(net, xshard::input<double>("x", {64, 784}));
///     std::cout << p;                   // dense1.matmul = matmul(x, dense1.weight) -> ...
///
/// A traced tensor has a shape and a dtype and no data. The operations of `xshard::ops` (and
/// the operators + - * / on traced tensors) record a node each, named by the scopes open
/// when it is recorded (`name_scope`) and the operation ("dense1.matmul"; a second matmul in
/// the same scope is "dense1.matmul_1"). `param` declares a weight, a named input of the
/// program with an initializer; declaring the same name again returns the same weight (a
/// shared weight). Control flow in the callable runs as C++ runs it, so a program is one
/// path through it: trace again for other input shapes (`compile<T>(fn, mesh, options,
/// inputs...)`, graph/executable.hpp, does so by itself).
///
/// Misuse raises xshard::error with one sentence naming the node: operands whose shapes do
/// not fit, a strategy for the wrong number of operands or dimensions. (Whether a strategy
/// fits a mesh is checked when the program is compiled onto one.)

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/annotation.hpp>
#include <xshard/graph/program.hpp>
#include <xshard/graph/registry.hpp>
#include <xshard/param/initializer.hpp>

#include <array>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard {

namespace detail {

/// The program being recorded on this thread, with the open scopes.
struct trace_state {
    program* target = nullptr;
    std::vector<std::string> scopes;
    std::map<std::string, int, std::less<>> used;
    std::optional<dtype> floating;
};

inline trace_state*& active_trace() {
    thread_local trace_state* state = nullptr;
    return state;
}

XSHARD_DECL trace_state& current_trace(std::string_view what);

/// "scope1.scope2.name".
XSHARD_DECL std::string scoped_name(const trace_state& s, std::string_view name);

} // namespace detail

/// A symbolic tensor of a program being traced: a value of the program, with its shape and
/// dtype and no data. Operations of `xshard::ops` on it record nodes.
class traced_tensor {
public:
    /// Marks traced operands for xshard's operations (ops/annotated.hpp).
    static constexpr bool is_traced = true;

    traced_tensor(program* p, std::size_t id)
        : program_(p)
        , id_(id) {}

    /// The value's id in its program.
    std::size_t id() const noexcept { return id_; }
    /// The global shape.
    const value_shape& shape() const { return program_->value(id_).shape; }
    /// The number of dimensions.
    std::size_t rank() const { return shape().size(); }
    dtype type() const { return program_->value(id_).type; }
    /// The program it belongs to.
    program& owner() const noexcept { return *program_; }

    /// Records operation `op` (a primitive's name) on traced operands; the hook of the
    /// operations of `xshard::ops` (ops/annotated.hpp).
    template <class... Rest>
    friend traced_tensor trace_call(std::string_view op, op_attributes attributes,
                                    const op_annotation& annotation, const traced_tensor& first,
                                    const Rest&... rest) {
        return record(op, std::move(attributes), annotation, {first, rest...}).front();
    }

    friend traced_tensor operator+(const traced_tensor& a, const traced_tensor& b) {
        return trace_call("add", {}, {}, a, b);
    }
    friend traced_tensor operator-(const traced_tensor& a, const traced_tensor& b) {
        return trace_call("sub", {}, {}, a, b);
    }
    friend traced_tensor operator*(const traced_tensor& a, const traced_tensor& b) {
        return trace_call("mul", {}, {}, a, b);
    }
    friend traced_tensor operator/(const traced_tensor& a, const traced_tensor& b) {
        return trace_call("div", {}, {}, a, b);
    }
    friend traced_tensor operator-(const traced_tensor& a) { return trace_call("neg", {}, {}, a); }
    /// c x, x c, x / c: "scale".
    friend traced_tensor operator*(double c, const traced_tensor& a) {
        return trace_call("scale", {{}, {c}}, {}, a);
    }
    friend traced_tensor operator*(const traced_tensor& a, double c) { return c * a; }
    friend traced_tensor operator/(const traced_tensor& a, double c) { return (1.0 / c) * a; }
    /// x + c, c + x, x - c: "add_scalar".
    friend traced_tensor operator+(const traced_tensor& a, double c) {
        return trace_call("add_scalar", {{}, {c}}, {}, a);
    }
    friend traced_tensor operator+(double c, const traced_tensor& a) { return a + c; }
    friend traced_tensor operator-(const traced_tensor& a, double c) { return a + (-c); }

    /// Records `op` with any number of results (custom operations); see `trace_call`.
    static std::vector<traced_tensor> record(std::string_view op, op_attributes attributes,
                                             const op_annotation& annotation,
                                             const std::vector<traced_tensor>& operands,
                                             std::shared_ptr<const custom_op_base> custom = {});

private:
    static void check_annotation(const program_node& n, std::span<const operand_type> types);

    program* program_;
    std::size_t id_;
};

/// An input of a program: its name, global shape and element type.
struct input_spec {
    std::string name;
    value_shape shape;
    dtype type = dtype::f64;
};

/// An input named `name` of shape `shape` and element type T (float, double, or an integer
/// type for labels and ids).
template <class T>
input_spec input(std::string name, value_shape shape) {
    return {std::move(name), std::move(shape), dtype_for<T>()};
}

/// Declares the weight `name` (prefixed by the open scopes) of shape `shape`, drawn by
/// `init` (param/initializer.hpp: the same values on any mesh), in the program being traced,
/// and returns it; a name declared before returns that weight (its shape must agree). Its
/// element type is the program's floating type (that of its first floating input).
XSHARD_DECL traced_tensor param(std::string_view name, value_shape shape,
                                initializer init = initializer::he_uniform());

/// Names the nodes and weights recorded while it lives "name.…" (scopes nest), as a module
/// path does: `{ xshard::name_scope s("layer1"); ... }`.
class name_scope {
public:
    explicit name_scope(std::string name) {
        detail::current_trace("xshard::name_scope").scopes.push_back(std::move(name));
    }
    ~name_scope() { detail::active_trace()->scopes.pop_back(); }
    name_scope(const name_scope&) = delete;
    name_scope& operator=(const name_scope&) = delete;
};

namespace detail {

template <class R>
void add_outputs(program& p, const R& r) {
    if constexpr (std::is_same_v<std::remove_cvref_t<R>, traced_tensor>) {
        if (&r.owner() != &p)
            throw error("xshard: trace: the traced function returned a value of another program");
        p.add_output(r.id());
    } else if constexpr (requires { std::tuple_size<std::remove_cvref_t<R>>::value; }) {
        std::apply([&](const auto&... e) { (add_outputs(p, e), ...); }, r);
    } else {
        static_assert(std::is_same_v<R, traced_tensor>,
                      "xshard: trace: the traced function returns a traced_tensor, or a tuple "
                      "or pair of them");
    }
}

} // namespace detail

/// Records the program of `fn` called on traced tensors of the `inputs`' shapes and types
/// (one per parameter of `fn`); `fn` returns a traced tensor, or a tuple of them (the
/// outputs). Throws what tracing throws, after restoring any trace that was active.
template <class F, class... In>
    requires(std::is_same_v<In, input_spec> && ...)
program trace(F&& fn, const In&... inputs) {
    program p;
    detail::trace_state state;
    state.target = &p;
    for (const input_spec& in : std::initializer_list<input_spec>{inputs...})
        if (in.type != dtype::i64 && !state.floating)
            state.floating = in.type;
    // Braced: the inputs are added in the order of fn's parameters.
    const std::array<std::size_t, sizeof...(In)> ids{
        p.add_argument(value_kind::input, inputs.name, inputs.shape, inputs.type)...};
    auto* previous = detail::active_trace();
    detail::active_trace() = &state;
    try {
        auto r = [&]<std::size_t... I>(std::index_sequence<I...>) {
            return std::forward<F>(fn)(traced_tensor(&p, ids[I])...);
        }(std::index_sequence_for<In...>{});
        detail::add_outputs(p, r);
    } catch (...) {
        detail::active_trace() = previous;
        throw;
    }
    detail::active_trace() = previous;
    return p;
}

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/graph/trace.ipp>
#endif
