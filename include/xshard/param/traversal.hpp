#pragma once
/// \file
/// Containers of named parameters, and what the training algorithms see of them.
///
/// `for_each_parameter(container, f)` calls `f(name, tensor)` for every parameter
/// (`for_each_weight` every `weight`, `gradients_of(container)` their gradients), with dotted names
/// for nested containers ("block1.dense2.weight"). It understands:
///  * a distributed tensor (one parameter, named by its prefix), a `parameter<D>`, or a
///    `weight<D>` (its value; xshard/nn/ layers hold them);
///  * `std::map<std::string, T>` and `std::unordered_map<std::string, T>`;
///  * any range (std or range-v3) of such things: a parameter's own name is used, other
///    elements are named by their index;
///  * `std::tuple` of such things (of different element types, float and double together):
///    named by their own names, or their index;
///  * a user type that opts in with a hidden friend (found by ADL, like mdspan's customisation
///    points):
///
///        struct dense {
///            xshard::dtensor<float, mesh_t, "[-, mp]"> weight, bias;
///            friend void visit_parameters(dense& d, auto&& visit) {
///                visit("weight", d.weight);
///                visit("bias", d.bias);
///            }
///        };
///
///    `visit(name, member)` accepts a tensor, a parameter, or anything this list accepts
///    (a sub-module, a vector of layers...), so models nest to any depth. The one overload
///    taking `T&` also serves traversals of a const container (members are then const).

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/tensor/dtensor.hpp>
#include <xshard/param/parameter.hpp>
#include <xshard/param/tensor_record.hpp>
#include <xshard/param/weight.hpp>

#include <map>
#include <ranges>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace xshard {

namespace detail {

/// Calls `f(name, tensor, trainable)` if `f` takes the flag, `f(name, tensor)` otherwise.
template <class F, class T>
void call_visitor(F& f, const std::string& name, T& tensor, bool trainable) {
    if constexpr (std::is_invocable_v<F&, const std::string&, T&, bool>)
        f(name, tensor, trainable);
    else
        f(name, tensor);
}

XSHARD_DECL std::string join_name(std::string_view prefix, std::string_view name);

/// Whether T is a std::tuple (the heterogeneous parameter container; shard()'s specs too).
template <class T>
struct is_tuple : std::false_type {};
template <class... T>
struct is_tuple<std::tuple<T...>> : std::true_type {};

/// Whether T is a `parameter` (a named tensor).
template <class T>
struct is_parameter : std::false_type {};
template <class D>
struct is_parameter<parameter<D>> : std::true_type {};

template <class T>
struct is_weight : std::false_type {};
template <class D>
struct is_weight<weight<D>> : std::true_type {};

template <class M>
concept string_keyed_map = requires {
    typename M::key_type;
    typename M::mapped_type;
}
&&std::same_as<typename M::key_type, std::string>;

template <class T>
concept has_visit_parameters = requires(T& t) {
    visit_parameters(t, [](std::string_view, auto&) {});
};

/// What a traversal visits: parameters (tensors, `parameter`s, the values of `weight`s) or
/// weights (`weight` objects, for optimizers and gradients).
enum class leaves { parameters, weights };

template <leaves L, class C, class F>
void traverse(C&& c, F& f, std::string_view prefix);

/// An element of a tuple or a range: a parameter by its own name, anything else by its index.
template <leaves L, class E, class F>
void visit_element(E& e, F& f, std::string_view prefix, std::size_t index) {
    if constexpr (is_parameter<std::remove_const_t<E>>::value)
        traverse<L>(e, f, join_name(prefix, e.name));
    else
        traverse<L>(e, f, join_name(prefix, std::to_string(index)));
}

/// Walks container `c` (see the file comment), calling `f` for each leaf of kind L.
template <leaves L, class C, class F>
void traverse(C&& c, F& f, std::string_view prefix) {
    using X = std::remove_cvref_t<C>;
    if constexpr (distributed_tensor<X>) {
        if constexpr (L == leaves::parameters)
            call_visitor(f, std::string(prefix), c, true);
    } else if constexpr (is_parameter<X>::value) {
        if constexpr (L == leaves::parameters)
            call_visitor(f, prefix.empty() ? c.name : std::string(prefix), c.value, c.trainable);
    } else if constexpr (is_weight<X>::value) {
        if constexpr (L == leaves::parameters)
            call_visitor(f, std::string(prefix), c.value, true);
        else
            f(std::string(prefix), c);
    } else if constexpr (has_visit_parameters<X>) {
        // One hidden friend taking T& serves const traversals too: members are handed on const.
        constexpr bool is_const = std::is_const_v<std::remove_reference_t<C>>;
        visit_parameters(const_cast<X&>(c), [&](std::string_view name, auto& member) {
            if constexpr (is_const)
                traverse<L>(std::as_const(member), f, join_name(prefix, name));
            else
                traverse<L>(member, f, join_name(prefix, name));
        });
    } else if constexpr (string_keyed_map<X>) {
        for (auto& [name, value] : c)
            traverse<L>(value, f, join_name(prefix, name));
    } else if constexpr (is_tuple<X>::value) {
        std::size_t i = 0;
        std::apply([&](auto&... elements) { (visit_element<L>(elements, f, prefix, i++), ...); },
                   c);
    } else if constexpr (std::ranges::range<X>) {
        std::size_t i = 0;
        for (auto&& e : c)
            visit_element<L>(e, f, prefix, i++);
    } else {
        static_assert(std::is_void_v<X>,
                      "xshard: not a parameter container: use a distributed tensor, a parameter, "
                      "a map from names, a range, a tuple, or give the type a hidden friend "
                      "visit_parameters(T&, visit)");
    }
}

} // namespace detail

/// Calls `f(name, tensor)` for every parameter of `c` (see the file comment); `tensor` is a
/// reference to the distributed tensor (const if `c` is). A callback that takes a third
/// argument also gets whether the parameter is trainable (a `parameter`'s flag; true for a
/// bare tensor or a weight).
template <class C, class F>
void for_each_parameter(C&& c, F&& f, std::string_view prefix = {}) {
    detail::traverse<detail::leaves::parameters>(std::forward<C>(c), f, prefix);
}

/// Calls `f(name, w)` for every `weight` of `c` (named as for_each_parameter names its value).
template <class C, class F>
void for_each_weight(C&& c, F&& f) {
    detail::traverse<detail::leaves::weights>(std::forward<C>(c), f, {});
}

/// The gradients of the weights of `c`, as a parameter container with the same names (for
/// synchronize_gradients, norms and clipping).
template <class C>
struct gradients_of {
    C& container;
    explicit gradients_of(C& c)
        : container(c) {}
    friend void visit_parameters(gradients_of& g, auto&& visit) {
        for_each_weight(g.container,
                        [&](const std::string& name, auto& w) { visit(name, w.grad); });
    }
};
template <class C>
gradients_of(C&) -> gradients_of<C>;

/// Whether xshard can enumerate the parameters of C.
template <class C>
concept parameter_container = requires(C& c) {
    for_each_parameter(c, [](const std::string&, auto&) {});
};

/// Parameter name -> layout (a layout dictionary, MindSpore's parameter_layout_dict).
using layout_dict = std::map<std::string, layout>;

/// The record of every parameter of `c` (param/tensor_record.hpp), in enumeration order,
/// with its trainable flag (writable data unless `c` is const). What needs no tensor's own
/// type (names, layouts, shapes, bytes, groups) is read from these: one walk of a container
/// type then serves all of those algorithms, where a walk per algorithm would make a program
/// instantiate and compile the traversal of its model once for each of them.
template <class C>
std::vector<tensor_record> parameter_records(C& c) {
    std::vector<tensor_record> records;
    for_each_parameter(c, [&](const std::string& name, auto& t, bool trainable) {
        records.push_back(record_of(name, t, trainable));
    });
    return records;
}

/// The record of the value of every `weight` of `c` (named as for_each_weight names it), in
/// enumeration order: parameter_records for the weights alone.
template <class C>
std::vector<tensor_record> weight_records(C& c) {
    std::vector<tensor_record> records;
    for_each_weight(c, [&](const std::string& name, auto& w) {
        records.push_back(record_of(name, w.value));
    });
    return records;
}

/// The layout dictionary of a container: every parameter's current layout (the trainable
/// ones only with `trainable_only`: those that have gradients).
template <parameter_container C>
layout_dict layouts_of(const C& c, bool trainable_only = false) {
    layout_dict d;
    for (auto& r : parameter_records(c))
        if (r.trainable || !trainable_only)
            d[r.name] = r.lay;
    return d;
}

/// The names of a container's parameters, in enumeration order (the trainable ones only
/// with `trainable_only`).
template <parameter_container C>
std::vector<std::string> parameter_names(const C& c, bool trainable_only = false) {
    std::vector<std::string> names;
    for (auto& r : parameter_records(c))
        if (r.trainable || !trainable_only)
            names.push_back(std::move(r.name));
    return names;
}

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/param/traversal.ipp>
#endif
