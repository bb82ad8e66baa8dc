#pragma once
/// \file
/// How a sharded call prepares its inputs, each by its spec (shard/spec.hpp): a distributed
/// tensor is redistributed to its spec (nothing happens when it already has it); an
/// `xt::xtensor` every rank holds whole is distributed (local slicing); a `parameter` is
/// laid out in place by the call's parameter plan, once; so are the parameters of a module
/// (any parameter container) that the plan names by their dotted names
/// (train/lay_out.hpp), passed through by reference; anything else is passed through.
/// An input that does not change is passed by reference; the others are new tensors on the
/// mesh type the callable receives (with auto_redistribute, one whose operations insert
/// redistributions).

#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/param/parameter.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/shard/options.hpp>
#include <xshard/shard/relayout.hpp>
#include <xshard/shard/spec.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/dtensor.hpp>
#include <xshard/train/lay_out.hpp>

#include <xtensor/xtensor.hpp>

#include <cstddef>
#include <set>
#include <string>
#include <type_traits>
#include <utility>

namespace xshard::detail {

template <class T>
struct is_xtensor : std::false_type {};
template <class T, std::size_t N, xt::layout_type L>
struct is_xtensor<xt::xtensor<T, N, L>> : std::true_type {};

/// The tensor `t` on mesh `m` (the same ranks; another mesh type): moves the shard when `t`
/// is an rvalue.
template <class NewMesh, class D>
auto on_mesh(D&& t, const NewMesh& m) {
    using X = std::remove_cvref_t<D>;
    if constexpr (std::is_same_v<typename X::mesh_type, NewMesh>) {
        return X(std::forward<D>(t));
    } else {
        const auto shape = t.shape();
        const layout l = t.layout();
        return dtensor<typename X::value_type, NewMesh, X::static_layout>(
            unchecked, m, shape, typename X::local_type(std::forward<D>(t).local()), l);
    }
}

/// A distributed tensor input: itself when its spec keeps its layout and the mesh type stays,
/// else redistributed to its spec on the call's mesh type.
template <class Mesh, class CallMesh, class Arg, class Spec>
decltype(auto) shard_tensor(const Mesh& mesh, const CallMesh& call_mesh, Arg&& arg,
                            const Spec& spec, const call_log& log, const slot& what) {
    using A = std::remove_cvref_t<Arg>;
    if constexpr (std::is_same_v<Spec, none_t>) {
        note(log, what, "", arg.layout(), arg.layout(), "");
        if constexpr (std::is_same_v<typename A::mesh_type, CallMesh>)
            return std::forward<Arg>(arg); // nothing to do: passed on as it is
        else
            return on_mesh(std::forward<Arg>(arg), call_mesh);
    } else if constexpr (is_layout_spec<Spec>) {
        if constexpr (A::static_layout == Spec::value &&
                      std::is_same_v<typename A::mesh_type, CallMesh>) {
            note(log, what, "", arg.layout(), arg.layout(), "");
            return std::forward<Arg>(arg);
        } else {
            return on_mesh(relayout<Spec::value>(std::forward<Arg>(arg), Spec::value, log, what),
                           call_mesh);
        }
    } else {
        const layout l = spec_layout(spec, A::rank, mesh.shape());
        return on_mesh(relayout<dynamic_layout(A::rank)>(std::forward<Arg>(arg), l, log, what),
                       call_mesh);
    }
}

/// A global array every rank holds whole: distributed by its spec (local slicing).
template <class Mesh, class CallMesh, class Array, class Spec>
auto shard_array(const Mesh& mesh, const CallMesh& call_mesh, Array& arg, const Spec& spec,
                 const call_log& log, const slot& what) {
    constexpr std::size_t N = std::remove_cv_t<Array>::rank;
    if constexpr (is_layout_spec<Spec>) {
        note(log, what, " (array held whole)", layout::replicated(N), Spec::value,
             "   (local slicing)\n");
        return on_mesh(distribute<Spec::value>(mesh, arg), call_mesh);
    } else {
        layout l;
        if constexpr (std::is_same_v<Spec, none_t>)
            l = kept_layout(mesh, arg);
        else
            l = spec_layout(spec, N, mesh.shape());
        note(log, what, " (array held whole)", layout::replicated(N), l, "   (local slicing)\n");
        return on_mesh(distribute<dynamic_layout(N)>(mesh, arg, l), call_mesh);
    }
}

/// A call's parameter plan and the names it has matched so far: a name matches as written
/// or with MindSpore's "self." before it. After the inputs, every name must have matched.
struct plan_use {
    const parameter_plan& plan;
    std::set<std::string> used;

    /// The layout planned for the parameter `name`, or null.
    const layout* find(const std::string& name) {
        for (const auto& key : {name, "self." + name})
            if (const auto it = plan.find(key); it != plan.end()) {
                used.insert(key);
                return &it->second;
            }
        return nullptr;
    }

    /// Throws, naming it, for a planned name that no parameter of the call has.
    void check_used() const {
        for (const auto& [name, l] : plan)
            if (!used.contains(name))
                throw error("xshard: the parameter plan names '" + name +
                            "', which no parameter passed to the sharded callable has");
    }
};

/// A parameter: laid out in place by the parameter plan when the plan names it (then passed
/// on as it is), else its tensor prepared by the spec.
template <class Mesh, class CallMesh, class Param, class Spec>
decltype(auto) shard_parameter(const Mesh& mesh, const CallMesh& call_mesh, Param& arg,
                               const Spec& spec, plan_use* plan, const call_log& log,
                               const slot& what) {
    if (const layout* l = plan ? plan->find(arg.name) : nullptr) {
        arg.plan(*l);
        using D = typename Param::tensor_type;
        if (!(arg.value.layout() == *l)) {
            if constexpr (D::static_layout.dynamic)
                arg.value = relayout<D::static_layout>(arg.value, *l, log, what);
            else
                throw error("xshard: the plan lays parameter '" + arg.name + "' out as " +
                            l->to_string() + " but its type fixes " + D::static_layout.to_string());
        }
        return shard_tensor(mesh, call_mesh, arg.value, none, log, what);
    }
    return shard_tensor(mesh, call_mesh, arg.value, spec, log, what);
}

/// A module: the parameters the plan names laid out in place (lay_out_parameters).
template <class Module>
void plan_module(Module& m, plan_use& plan) {
    layout_dict planned;
    for_each_parameter(m, [&](const std::string& name, const auto&) {
        if (const layout* l = plan.find(name))
            planned[name] = *l;
    });
    if (planned.empty())
        return;
    if constexpr (std::is_const_v<Module>)
        throw error("xshard: the parameter plan lays out '" + planned.begin()->first +
                    "' of a module passed to the sharded callable as const");
    else
        lay_out_parameters(m, planned);
}

/// One input of a call, prepared by its spec: a reference to the argument itself when
/// nothing changes (and the mesh type stays), a new tensor otherwise.
template <class Mesh, class CallMesh, class Arg, class Spec>
decltype(auto) shard_input(const Mesh& mesh, const CallMesh& call_mesh, Arg&& arg, const Spec& spec,
                           plan_use* plan, const call_log& log, const slot& what) {
    using A = std::remove_cvref_t<Arg>;
    if constexpr (is_parameter<A>::value) {
        static_assert(
            std::is_lvalue_reference_v<Arg> && !std::is_const_v<std::remove_reference_t<Arg>>,
            "xshard: a parameter passed to a sharded callable must be a modifiable lvalue "
            "(its parameter plan lays it out in place)");
        return shard_parameter(mesh, call_mesh, arg, spec, plan, log, what);
    } else if constexpr (is_xtensor<A>::value) {
        return shard_array(mesh, call_mesh, arg, spec, log, what);
    } else if constexpr (distributed_tensor<A>) {
        return shard_tensor(mesh, call_mesh, std::forward<Arg>(arg), spec, log, what);
    } else if constexpr (parameter_container<std::remove_reference_t<Arg>> &&
                         std::is_lvalue_reference_v<Arg>) {
        static_assert(std::is_same_v<Spec, none_t>,
                      "xshard: a module passed to a sharded callable takes the spec xshard::none");
        if (plan)
            plan_module(arg, *plan);
        return std::forward<Arg>(arg);
    } else {
        static_assert(std::is_same_v<Spec, none_t>,
                      "xshard: an argument that is not a tensor takes the spec xshard::none");
        return std::forward<Arg>(arg);
    }
}

/// What a callable of local semantics receives for an input: the local shard of a
/// distributed tensor, anything else as it is.
template <class T>
decltype(auto) local_of_arg(T&& x) {
    if constexpr (distributed_tensor<std::remove_cvref_t<T>>)
        return (std::forward<T>(x).local());
    else
        return std::forward<T>(x);
}

} // namespace xshard::detail
