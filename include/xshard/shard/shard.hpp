#pragma once
/// \file
/// shard(): wrap any callable so that it runs on distributed tensors laid out as asked.
///
///     auto f = xshard::shard(mesh, fn, std::tuple(in_0, in_1, ...), out);
///     auto y = f(x0, x1, ...);
///
/// Each input spec is `xshard::spec<"[dp, mp]">` (a layout type: the plan is fixed at compile
/// time), a `layout` value, a MindSpore `strategy{4, 2}` (resolved on the mesh, see
/// core/strategy.hpp), or `xshard::none` (keep the input's layout; an array every rank holds
/// whole is replicated, or split over the data-parallel axis by the mesh's dataset
/// strategy; derived under sharding_propagation, below). Inputs may be distributed tensors (redistributed to their spec; nothing
/// happens when they already have it), `xt::xtensor`s every rank holds whole (distributed:
/// local slicing), `parameter`s (laid out by the parameter plan, see below) and anything
/// else, passed through (spec `none`). The output spec (one, or a tuple for a tuple of
/// outputs) redistributes the outputs; `none`, or no spec, keeps the layout the computation
/// gives them (or applies the dataset strategy when the mesh has one).
///
/// Two modes:
///  * `shard`: *global semantics*. `fn` receives distributed tensors and is written with
///    xshard's operations, whose sharding rules give every result its layout type: calling
///    `fn` is the propagation. With `xshard::auto_redistribute` the tensors `fn` receives
///    live on a mesh type whose operations insert the redistributions their rules need (as
///    MindSpore does); by default such a need is a compile error (an exception for run-time
///    layouts) naming `redistribute`.
///  * `shard_local`: *local semantics* (JAX shard_map, MindSpore's hybrid mode). `fn`
///    receives the local shards (`xt::xtensor`s) and returns local arrays; the output specs,
///    required, declare their layouts, partial ones included. The global shapes are worked
///    out from every rank's local shape (an all-gather of the shapes), and a local shape that
///    contradicts its layout raises an exception on every rank.
///
/// A parameter plan (`parameter_plan{{"dense.weight", "[mp, -]"}}`) lays out the named
/// `parameter`s a call receives, in place, once; a parameter planned differently by two
/// shard() calls is an error naming it and both layouts.
///
/// Sharding propagation (MindSpore's `sharding_propagation` mode; seed 004's "a None in
/// in_strategy is automatically derived"): with the option `xshard::sharding_propagation{level}`
/// the `none` spec of a distributed tensor or of an array every rank holds whole is derived
/// rather than kept. `fn` is any callable, so the graph of its operations is known only by
/// running it: on the first call with given layouts, shapes and element types, every
/// candidate layout of the derived inputs (every layout that is not partial over the axes
/// of more than one rank; all combinations up to 64, else each input in turn) runs the
/// whole call twice on copies of the arguments, and the cheapest by `level` is kept:
///  * 0, the least communication: the call's redistributions (the inputs', those the
///    operations insert under auto_redistribute, the outputs') priced by the planner's
///    alpha-beta model (redistribute/meter.hpp), then the time;
///  * 1, the least memory: the bytes of the shards `fn` receives and returns, then the time;
///  * 2, the fastest: the measured time of the call, then the memory.
/// The costs are the maxima over the ranks, all-reduced, so every rank derives alike; a
/// candidate whose call raises (layouts an operation's rule refuses) is not one; when every
/// candidate raises, the call runs with the kept layouts and raises what it raises. The
/// choice is cached; the next calls run `fn` once. `fn` must be free of side effects beyond
/// its result, as for MindSpore, which compiles it. `derived_layouts()` names the choice,
/// `describe()` prints it. An operation's own reductions of statistics (normalisation,
/// cross entropy) are not priced at level 0. shard_local keeps its specs.
///
/// A callable that throws on some ranks raises on every rank: the outcome of `fn` is agreed
/// (one all-reduce of one int) before any collective that follows it; the ranks where it
/// threw rethrow their exception, the others throw xshard::error naming the lowest of them.
///
/// Beyond the collectives of its redistributions a call costs little at run time: inputs
/// already in their layout are passed by reference; for typed specs the candidate steps
/// are computed at compile time, and the plans (the choice among them, geometry,
/// datatypes) are built at the first call and cached. `describe()` on the returned callable
/// (after a call) prints the layouts of the inputs and outputs and the redistribution steps
/// taken.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/objective.hpp>
#include <xshard/core/strategy.hpp>
#include <xshard/ops/operand.hpp>
#include <xshard/redistribute/meter.hpp>
#include <xshard/redistribute/redistribute.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/dtensor.hpp>
#include <xshard/param/parameter.hpp>
#include <xshard/param/traversal.hpp>

#include <xtensor/xtensor.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard {

/// The spec "keep the layout / derive it".
struct none_t {};
inline constexpr none_t none{};

/// A layout type as a spec: `spec<"[dp, -]">`.
template <layout L>
struct layout_spec {
    static constexpr layout value = L;
};
template <layout L>
inline constexpr layout_spec<L> spec{};

/// The option that lets operations inside a global-semantics shard() insert redistributions.
struct auto_redistribute_t {};
inline constexpr auto_redistribute_t auto_redistribute{};

/// Parameter name -> layout.
using parameter_plan = std::map<std::string, layout>;

/// The option of MindSpore's `sharding_propagation` mode: the `none` specs of tensor inputs
/// are derived, by the objective `level` (seed 004's shard level: 0 the least
/// communication, 1 the least memory, 2 the fastest). See "Sharding propagation" above.
struct sharding_propagation {
    int level = 0;
};

namespace detail {

template <class T>
struct is_xtensor : std::false_type {};
template <class T, std::size_t N, xt::layout_type L>
struct is_xtensor<xt::xtensor<T, N, L>> : std::true_type {};

template <class S>
constexpr bool is_layout_spec = false;
template <layout L>
constexpr bool is_layout_spec<layout_spec<L>> = true;

/// A spec's layout for a tensor of rank `rank` on `mesh` (run-time specs only).
inline layout spec_layout(const layout& l, std::size_t, const mesh_shape&) {
    return l;
}
inline layout spec_layout(const strategy& s, std::size_t, const mesh_shape& mesh) {
    try {
        return resolve(s, mesh);
    } catch (const std::invalid_argument& e) {
        throw error(e.what());
    }
}

/// The layout the mesh's dataset strategy gives an input or output of rank N without a spec.
template <class Mesh>
layout dataset_layout(const Mesh& mesh, std::size_t rank, const layout& current) {
    switch (mesh.dataset()) {
    case dataset_strategy::full_batch:
        return layout::replicated(rank);
    case dataset_strategy::data_parallel: {
        layout l = layout::replicated(rank);
        if (rank > 0)
            l.dims[0].push_back(mesh.shape().names[mesh.data_axis()]);
        return l;
    }
    default:
        return current;
    }
}

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

/// A plan kept between calls. The cache holds plans of whatever types the calls bring (a
/// callable called with float tensors, then with double ones of the same layouts, keeps a
/// plan of each); a plan is found by its type, never cast to one.
struct cached_plan {
    virtual ~cached_plan() = default;
};
template <class Plan>
struct typed_plan final : cached_plan {
    template <class... A>
    explicit typed_plan(A&&... a)
        : plan(std::forward<A>(a)...) {}
    Plan plan;
};

/// The plans of a sharded callable: by input or output slot, then by plan type.
class plan_cache {
public:
    /// The cached plan of type Plan in slot `slot`, or null.
    template <class Plan>
    Plan* find(std::size_t slot) const {
        if (slot >= slots_.size())
            return nullptr;
        for (const auto& p : slots_[slot])
            if (auto* typed = dynamic_cast<typed_plan<Plan>*>(p.get()))
                return &typed->plan;
        return nullptr;
    }

    /// Caches a new plan of type Plan in slot `slot` (replacing one of the same type) and
    /// returns it.
    template <class Plan, class... A>
    Plan& emplace(std::size_t slot, A&&... a) {
        if (slot >= slots_.size())
            slots_.resize(slot + 1);
        auto made = std::make_unique<typed_plan<Plan>>(std::forward<A>(a)...);
        Plan& plan = made->plan;
        auto& entries = slots_[slot];
        for (auto& p : entries)
            if (dynamic_cast<typed_plan<Plan>*>(p.get())) {
                p = std::move(made);
                return plan;
            }
        entries.push_back(std::move(made));
        return plan;
    }

private:
    std::vector<std::vector<std::unique_ptr<cached_plan>>> slots_;
};

/// Where a call records what it did (when traced) and keeps its plans between calls.
struct call_log {
    std::string* report = nullptr; ///< null when not tracing
    plan_cache* plans = nullptr;
};

/// An input or output of a call: "input 1", "output 0"; the label is built only when traced.
struct slot {
    const char* kind;
    std::size_t index;
    std::size_t plan; ///< its plan slot
    std::string label() const { return std::string(kind) + " " + std::to_string(index); }
};

/// Appends "label: from -> to" and the plan's steps to the report (when tracing).
inline void note(const call_log& log, const slot& s, const char* what, const layout& from,
                 const layout& to, const std::string& plan) {
    if (!log.report)
        return;
    *log.report += s.label() + what + ": " + from.to_string();
    if (from == to)
        *log.report += " (kept)\n";
    else
        *log.report += " -> " + to.to_string() + "\n" + plan;
}

/// Redistributes a distributed tensor to `to`, with the plan kept in the call's slot for the
/// next call (plans are built once per call site, shape and layouts), or returns it as it is.
/// The tensors a call hands itself are its own, so the plan runs without the collective
/// check for resized shards.
template <layout To, class D>
auto relayout(D&& t, const layout& to, const call_log& log, const slot& s) {
    using X = std::remove_cvref_t<D>;
    using plan_type = redistribution<X, To>;
    if (t.layout() == to) {
        note(log, s, "", t.layout(), to, "");
        return redistribute<To>(std::forward<D>(t), to);
    }
    auto* plan = log.plans->find<plan_type>(s.plan);
    if (!plan || !plan->fits(t, to))
        plan = &log.plans->emplace<plan_type>(s.plan, t, to);
    if (log.report) // the printout only when tracing: it is not free
        note(log, s, "", t.layout(), to, plan->describe());
    typename plan_type::result_type out(
        unchecked, t.mesh(), t.shape(),
        plan_type::result_type::local_type::from_shape(plan->plan().destination_block().extent),
        to);
    plan->execute_unchecked(t, out);
    return out;
}

/// The layout `none` gives an argument without derivation: its own, or the dataset
/// strategy's for an array held whole.
template <class Mesh, class A>
layout kept_layout(const Mesh& mesh, const A& a) {
    if constexpr (distributed_tensor<A>)
        return a.layout();
    else
        return dataset_layout(mesh, A::rank, layout::replicated(A::rank));
}

/// One input of a call, prepared by its spec: a reference to the argument itself when
/// nothing changes (and the mesh type stays), a new tensor otherwise.
template <class Mesh, class CallMesh, class Arg, class Spec>
decltype(auto) shard_input(const Mesh& mesh, const CallMesh& call_mesh, Arg&& arg, const Spec& spec,
                           const parameter_plan* plan, const call_log& log, const slot& what) {
    using A = std::remove_cvref_t<Arg>;
    if constexpr (is_parameter<A>::value) {
        static_assert(
            std::is_lvalue_reference_v<Arg> && !std::is_const_v<std::remove_reference_t<Arg>>,
            "xshard: a parameter passed to a sharded callable must be a modifiable lvalue "
            "(its parameter plan lays it out in place)");
        if (plan) {
            if (const auto it = plan->find(arg.name); it != plan->end()) {
                arg.plan(it->second);
                using D = typename A::tensor_type;
                if (!(arg.value.layout() == it->second)) {
                    if constexpr (D::static_layout.dynamic)
                        arg.value = relayout<D::static_layout>(arg.value, it->second, log, what);
                    else
                        throw error("xshard: the plan lays parameter '" + arg.name + "' out as " +
                                    it->second.to_string() + " but its type fixes " +
                                    D::static_layout.to_string());
                }
                return shard_input(mesh, call_mesh, arg.value, none, nullptr, log, what);
            }
        }
        return shard_input(mesh, call_mesh, arg.value, spec, nullptr, log, what);
    } else if constexpr (is_xtensor<A>::value) {
        // A global array every rank holds whole.
        constexpr std::size_t N = A::rank;
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
            note(log, what, " (array held whole)", layout::replicated(N), l,
                 "   (local slicing)\n");
            return on_mesh(distribute<dynamic_layout(N)>(mesh, arg, l), call_mesh);
        }
    } else if constexpr (distributed_tensor<A>) {
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
                return on_mesh(
                    relayout<Spec::value>(std::forward<Arg>(arg), Spec::value, log, what),
                    call_mesh);
            }
        } else {
            const layout l = spec_layout(spec, A::rank, mesh.shape());
            return on_mesh(relayout<dynamic_layout(A::rank)>(std::forward<Arg>(arg), l, log, what),
                           call_mesh);
        }
    } else {
        static_assert(std::is_same_v<Spec, none_t>,
                      "xshard: an argument that is not a tensor takes the spec xshard::none");
        return std::forward<Arg>(arg);
    }
}

/// One output of a call, redistributed by its spec and back on the plain mesh type.
template <class Mesh, class Out, class Spec>
auto shard_output(const Mesh& mesh, Out&& out, const Spec& spec, const call_log& log,
                  const slot& what) {
    using O = std::remove_cvref_t<Out>;
    if constexpr (!distributed_tensor<O>) {
        return O(std::forward<Out>(out));
    } else {
        auto plain = on_mesh(std::forward<Out>(out), mesh);
        if constexpr (is_layout_spec<Spec>) {
            return relayout<Spec::value>(std::move(plain), Spec::value, log, what);
        } else if constexpr (std::is_same_v<Spec, none_t>) {
            // Kept, or laid out by the mesh's dataset strategy: a run-time layout follows it;
            // a layout type must already agree (the result's type cannot depend on a setting).
            const layout l = dataset_layout(mesh, O::rank, plain.layout());
            if constexpr (O::static_layout.dynamic) {
                return relayout<O::static_layout>(std::move(plain), l, log, what);
            } else {
                if (!(l == plain.layout()))
                    throw error("xshard: shard: " + what.label() + " has layout type " +
                                plain.layout().to_string() + " but the dataset strategy asks for " +
                                l.to_string() + "; give the output a spec");
                note(log, what, "", l, l, "");
                return plain;
            }
        } else {
            const layout l = spec_layout(spec, O::rank, mesh.shape());
            return relayout<dynamic_layout(O::rank)>(std::move(plain), l, log, what);
        }
    }
}

template <class Specs, std::size_t I>
const auto& spec_at(const Specs& specs) {
    if constexpr (is_tuple<Specs>::value)
        return std::get<I>(specs);
    else
        return specs;
}

/// The global shape of a tensor laid out as `l` whose shard on this rank has shape `local`:
/// from every rank's local shape (an all-gather). Throws on every rank if a rank's local
/// shape contradicts the layout.
template <class Mesh, std::size_t N>
std::array<std::size_t, N> global_shape_of(const Mesh& mesh, const layout& l,
                                           const std::array<std::size_t, N>& local,
                                           const slot& what) {
    const auto& ms = mesh.shape();
    std::vector<unsigned long long> all(std::size_t(mesh.size()) * N);
    std::array<unsigned long long, N> mine{};
    for (std::size_t d = 0; d < N; ++d)
        mine[d] = local[d];
    if constexpr (N > 0)
        allgather(mesh.comm(), mine, all);
    auto extent = [&](int r, std::size_t d) {
        return std::size_t(all[std::size_t(r) * N + d]);
    };
    std::array<std::size_t, N> shape{};
    for (std::size_t d = 0; d < N; ++d) {
        // Walk the blocks of dimension d on the ranks at coordinate 0 off its axes.
        const auto axes = l.split_axes(d, ms);
        for (int r : ms.group_ranks(0, axes))
            shape[d] += extent(r, d);
    }
    for (int r = 0; r < mesh.size(); ++r) {
        const auto b = block_of(l, ms, shape, r);
        for (std::size_t d = 0; d < N; ++d)
            if (b.extent[d] != extent(r, d))
                throw error("xshard: " + what.label() + ": the local result of rank " +
                            std::to_string(r) + " has extent " + std::to_string(extent(r, d)) +
                            " in dimension " + std::to_string(d) + ", which layout " +
                            l.to_string() + " cannot give it (global shape " + shape_string(shape) +
                            ")");
    }
    return shape;
}

/// A local result wrapped as a distributed tensor laid out by its (required) spec.
template <class Mesh, class Local, class Spec>
auto wrap_local(const Mesh& mesh, Local&& local, const Spec& spec, const call_log& log,
                const slot& what) {
    using L = std::remove_cvref_t<Local>;
    static_assert(is_xtensor<L>::value,
                  "xshard: shard_local: the callable must return xt::xtensor results (a tuple of "
                  "them for several outputs)");
    static_assert(!std::is_same_v<Spec, none_t>,
                  "xshard: shard_local needs a layout for every output (spec<...> or a layout)");
    constexpr std::size_t N = L::rank;
    const auto extent = to_array<N>(local.shape());
    if constexpr (is_layout_spec<Spec>) {
        const auto shape = global_shape_of(mesh, Spec::value, extent, what);
        note(log, what, " (declared)", Spec::value, Spec::value, "");
        return dtensor<typename L::value_type, Mesh, Spec::value>(unchecked, mesh, shape,
                                                                  std::forward<Local>(local));
    } else {
        const layout l = spec_layout(spec, N, mesh.shape());
        const auto shape = global_shape_of(mesh, l, extent, what);
        note(log, what, " (declared)", l, l, "");
        return dtensor<typename L::value_type, Mesh, dynamic_layout(N)>(
            unchecked, mesh, shape, std::forward<Local>(local), l);
    }
}

/// An argument whose `none` spec sharding_propagation derives: a distributed tensor or an
/// array every rank holds whole (a parameter keeps its plan or its layout).
template <class A>
constexpr bool derivable = distributed_tensor<A> || is_xtensor<A>::value;

/// The spec input I gets under sharding_propagation: a run-time layout where `none` meets a
/// derivable argument, the given spec elsewhere.
template <class Spec, class Arg>
using propagated_spec_t = std::conditional_t<
    std::is_same_v<Spec, none_t> && derivable<std::remove_cvref_t<Arg>>, layout, Spec>;

template <class Spec, class Given>
Spec propagated_spec(const Given& given, const std::optional<layout>& derived) {
    if constexpr (std::is_same_v<Spec, Given>)
        return given;
    else
        return *derived;
}

/// The layouts a derived input of rank N may take: first `kept`, then every layout of rank N
/// that is not partial, over the mesh's axes of more than one rank. Only `kept` past
/// `max_route_layouts` (the routes' bound).
template <class Mesh>
std::vector<layout> derivation_candidates(const Mesh& mesh, std::size_t N, const layout& kept) {
    std::vector<layout> out{kept};
    static_vector<axis_name, max_mesh_axes> names;
    static_vector<int, max_mesh_axes> sizes;
    const auto& ms = mesh.shape();
    for (std::size_t i = 0; i < ms.ndim(); ++i)
        if (ms.sizes[i] > 1) {
            names.push_back(ms.names[i]);
            sizes.push_back(ms.sizes[i]);
        }
    for (auto& l : all_layouts_on(mesh_shape(names, sizes), N, {}, max_route_layouts))
        if (l.partial.empty() && !(l == kept))
            out.push_back(std::move(l));
    return out;
}

/// The bytes of the local shards a call's tensor holds on this rank (summed over a tuple).
template <class X>
std::size_t local_bytes(const X& x) {
    using A = std::remove_cvref_t<X>;
    if constexpr (distributed_tensor<A>)
        return x.local().size() * sizeof(typename A::value_type);
    else if constexpr (is_tuple<A>::value)
        return std::apply([](const auto&... e) { return (std::size_t(0) + ... + local_bytes(e)); },
                          x);
    else
        return 0;
}

/// What a candidate's call cost, the maximum over the ranks: measured seconds, the
/// redistributions' predicted seconds, the bytes of the inputs and outputs of `fn`.
struct trial_cost {
    double seconds = 0;
    double communication = 0;
    double memory = 0;
};

/// Whether `a` is cheaper than `b` by objective `level` (lexicographic: communication then
/// time at 0, memory then time at 1, time then memory at 2). Times within 2 % tie: a
/// redistribution is not worth the noise of one measurement.
inline bool cheaper(int level, const trial_cost& a, const trial_cost& b) {
    constexpr double noise = 0.02, exact = 1e-9;
    auto less = [](double x, double y, double tol) { return x < y - tol * std::max(y, 1e-300); };
    const auto ka = objective_of(level, a.seconds, a.communication, a.memory);
    const auto kb = objective_of(level, b.seconds, b.communication, b.memory);
    const double tp = level == 2 ? noise : exact, ts = level == 2 ? exact : noise;
    if (less(ka.first, kb.first, tp))
        return true;
    if (less(kb.first, ka.first, tp))
        return false;
    return less(ka.second, kb.second, ts);
}

template <class T>
decltype(auto) local_of_arg(T&& x) {
    if constexpr (distributed_tensor<std::remove_cvref_t<T>>)
        return (std::forward<T>(x).local());
    else
        return std::forward<T>(x);
}

} // namespace detail

/// The callable shard() returns (see the file comment).
template <mesh_type Mesh, class F, class In, class Out, bool Local, bool Auto, bool Propagate = false>
class sharded {
public:
    sharded(Mesh mesh, F fn, In in, Out out, std::optional<parameter_plan> plan, int level = 0)
        : mesh_(std::move(mesh))
        , fn_(std::move(fn))
        , in_(std::move(in))
        , out_(std::move(out))
        , plan_(std::move(plan))
        , level_(level)
        , report_(std::make_shared<std::string>())
        , plans_(std::make_shared<detail::plan_cache>())
        , derivations_(std::make_shared<derivation_cache>())
        , derived_(std::make_shared<const std::vector<std::optional<layout>>*>(nullptr)) {
        if (!is_objective_level(level))
            throw error(bad_objective_level("xshard: shard: sharding_propagation's level", level));
    }

    /// Records, from the next call on, the layouts and redistributions of each call.
    sharded& traced(bool on = true) {
        trace_ = on;
        return *this;
    }

    /// The layouts of the last traced call's inputs and outputs and its redistribution steps.
    std::string describe() const { return *report_; }

    /// Under sharding_propagation: the layout the last call derived for each input whose spec
    /// is `none` (nullopt for the others); empty before the first call.
    const std::vector<std::optional<layout>>& derived_layouts() const {
        static const std::vector<std::optional<layout>> none_yet;
        return *derived_ ? **derived_ : none_yet;
    }

    template <class... Args>
    auto operator()(Args&&... args) const {
        static_assert(std::tuple_size_v<In> == sizeof...(Args),
                      "xshard: shard: give one input spec per argument (xshard::none to keep one)");
        const detail::call_log log{trace_ ? report_.get() : nullptr, plans_.get()};
        if (log.report)
            log.report->clear();
        if constexpr (Propagate)
            return call_propagated(log, std::index_sequence_for<Args...>{},
                                   std::forward<Args>(args)...);
        else
            return call(in_, log, nullptr, std::index_sequence_for<Args...>{},
                        std::forward<Args>(args)...);
    }

private:
    using call_mesh = std::conditional_t<Auto, redistributing_mesh<Mesh>, Mesh>;
    /// The derived layouts by the key of the derived inputs' layouts, shapes and types.
    using derivation_cache = std::map<std::string, std::vector<std::optional<layout>>>;

    /// One call with input specs `in`; adds the bytes of fn's inputs and outputs to `memory`.
    template <class Specs, std::size_t... I, class... Args>
    auto call(const Specs& in, const detail::call_log& log, std::size_t* memory,
              std::index_sequence<I...>, Args&&... args) const {
        const call_mesh cm = make_call_mesh();
        const parameter_plan* plan = plan_ ? &*plan_ : nullptr;
        // The prepared inputs, held by reference where nothing changes, by value otherwise.
        std::tuple<decltype(detail::shard_input(mesh_, cm, std::forward<Args>(args),
                                                std::get<I>(in), plan, log,
                                                detail::slot{"input", I, I}))...>
            inputs{detail::shard_input(mesh_, cm, std::forward<Args>(args), std::get<I>(in), plan,
                                       log, detail::slot{"input", I, I})...};
        // Agreed before any collective that follows: a callable that throws on some ranks
        // raises on every rank (its own exception where it threw, xshard::error naming the
        // rank elsewhere) instead of leaving the others in an output's redistribution.
        decltype(auto) result = agreed(mesh_.comm(), [&]() -> decltype(auto) {
            return invoke(inputs, std::index_sequence<I...>{});
        });
        if (memory)
            *memory += detail::local_bytes(inputs) + detail::local_bytes(result);
        return finish(std::forward<decltype(result)>(result), log, sizeof...(I));
    }

    /// The input specs with the derived layouts in place of the derived inputs' `none`.
    template <class... Args, std::size_t... I>
    auto propagated_specs(const std::vector<std::optional<layout>>& derived,
                          std::index_sequence<I...>) const {
        return std::tuple<detail::propagated_spec_t<std::tuple_element_t<I, In>, Args>...>(
            detail::propagated_spec<
                detail::propagated_spec_t<std::tuple_element_t<I, In>, Args>>(std::get<I>(in_),
                                                                              derived[I])...);
    }

    /// sharding_propagation: derives the `none` inputs' layouts (once per key), then calls.
    template <std::size_t... I, class... Args>
    auto call_propagated(const detail::call_log& log, std::index_sequence<I...> seq,
                         Args&&... args) const {
        std::vector<std::optional<layout>> kept(sizeof...(I));
        std::array<std::size_t, sizeof...(I)> ranks{};
        std::string key;
        bool arrays = false; // an array held whole among the derived inputs
        (
            [&] {
                using A = std::remove_cvref_t<Args>;
                if constexpr (std::is_same_v<std::tuple_element_t<I, In>, none_t> &&
                              detail::derivable<A>) {
                    arrays = arrays || !distributed_tensor<A>;
                    kept[I] = detail::kept_layout(mesh_, args);
                    ranks[I] = A::rank;
                    key += std::to_string(I) + ':' + kept[I]->to_string() +
                           detail::shape_string(args.shape()) + '/' +
                           std::to_string(sizeof(typename A::value_type)) + ';';
                }
            }(),
            ...);
        // The ranks must look the cache up with one key. Tensors' layouts and global shapes are
        // the same on every rank; an array held whole has each rank's own shape: one all-reduce
        // of the key's hash then, raised on every rank when they differ.
        if (arrays) {
            const auto hash = static_cast<unsigned long long>(std::hash<std::string>{}(key));
            if (!value_ranges<1>(mesh_.comm(), {hash})[0].agrees())
                throw error("xshard: shard: the ranks call with different layouts or shapes of "
                            "the inputs to derive: " + key);
        }
        auto found = derivations_->find(key);
        if (found == derivations_->end()) {
            std::vector<std::vector<layout>> options(sizeof...(I));
            for (std::size_t i = 0; i < kept.size(); ++i)
                if (kept[i])
                    options[i] = detail::derivation_candidates(mesh_, ranks[i], *kept[i]);
            found = derivations_->emplace(key, derive<Args...>(options, seq, args...)).first;
        }
        const auto& derived = found->second;
        *derived_ = &derived; // a node of the map: its address stays
        if (log.report)
            for (std::size_t i = 0; i < derived.size(); ++i)
                if (derived[i])
                    *log.report += "input " + std::to_string(i) + " derived (level " +
                                   std::to_string(level_) + "): " + kept[i]->to_string() +
                                   " -> " + derived[i]->to_string() + "\n";
        return call(propagated_specs<Args...>(derived, seq), log, nullptr, seq,
                    std::forward<Args>(args)...);
    }

    /// The cheapest assignment of candidate layouts to the derived inputs by `level_`: every
    /// combination when there are at most 64, else each input in turn with the others at
    /// their best so far. Each candidate runs the call twice (the first builds its plans) on
    /// copies of the arguments; one that raises (an operation whose rule the layouts break)
    /// is not a candidate. Every rank decides alike: the costs are all-reduced.
    template <class... Args, std::size_t... I>
    std::vector<std::optional<layout>> derive(const std::vector<std::vector<layout>>& options,
                                              std::index_sequence<I...> seq,
                                              const std::remove_reference_t<Args>&... args) const {
        std::vector<std::optional<layout>> best(options.size());
        std::size_t combinations = 1;
        for (std::size_t i = 0; i < options.size(); ++i)
            if (!options[i].empty()) {
                best[i] = options[i][0];
                combinations = options[i].size() > 64 / combinations
                                   ? 65
                                   : combinations * options[i].size();
            }
        std::optional<detail::trial_cost> best_cost = trial<Args...>(best, seq, args...);
        auto consider = [&](const std::vector<std::optional<layout>>& c) {
            const auto cost = trial<Args...>(c, seq, args...);
            if (cost && (!best_cost || detail::cheaper(level_, *cost, *best_cost))) {
                best_cost = cost;
                best = c;
            }
        };
        if (combinations <= 64) {
            std::vector<std::size_t> at(options.size(), 0);
            while (true) { // mixed-radix count over the inputs' candidates; 0...0 is done
                std::size_t i = 0;
                for (; i < options.size(); ++i) {
                    if (options[i].empty())
                        continue;
                    if (++at[i] < options[i].size())
                        break;
                    at[i] = 0;
                }
                if (i == options.size())
                    break;
                std::vector<std::optional<layout>> c(options.size());
                for (std::size_t j = 0; j < options.size(); ++j)
                    if (!options[j].empty())
                        c[j] = options[j][at[j]];
                consider(c);
            }
        } else {
            for (std::size_t i = 0; i < options.size(); ++i)
                for (std::size_t k = 1; k < options[i].size(); ++k) {
                    auto c = best;
                    c[i] = options[i][k];
                    consider(c);
                }
        }
        return best;
    }

    /// The agreed cost of one assignment, or nullopt when the call raised.
    template <class... Args, std::size_t... I>
    std::optional<detail::trial_cost> trial(const std::vector<std::optional<layout>>& derived,
                                            std::index_sequence<I...> seq,
                                            const std::remove_reference_t<Args>&... args) const {
        const auto specs = propagated_specs<Args...>(derived, seq);
        const detail::call_log quiet{nullptr, plans_.get()};
        // seconds, communication, memory: the maximum over the ranks.
        std::array<double, 3> cost{std::numeric_limits<double>::max(), 0, 0};
        for (int run = 0; run < 2; ++run) {
            std::size_t memory = 0;
            redistribution_meter meter;
            const auto start = std::chrono::steady_clock::now();
            bool failed = false;
            try {
                (void)call(specs, quiet, &memory, seq, copy_of(args)...);
                const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
                cost = {std::min(cost[0], took.count()), meter.seconds(), double(memory)};
            } catch (...) {
                failed = true;
            }
            // A failure the callable's agreement did not cover (a rank out of memory) still
            // ends the trial on every rank.
            if (first_reporting_rank(mesh_.comm(), failed) >= 0)
                return std::nullopt;
        }
        allreduce(mesh_.comm(), cost, reduction::max);
        return detail::trial_cost{cost[0], cost[1], cost[2]};
    }

    /// What a trial hands the call: a reference to a parameter (laid out in place by its
    /// plan, which every trial repeats alike), a copy of anything else.
    template <class A>
    static decltype(auto) copy_of(const A& a) {
        if constexpr (detail::is_parameter<A>::value)
            return const_cast<A&>(a);
        else
            return A(a);
    }

    call_mesh make_call_mesh() const {
        if constexpr (Auto)
            return call_mesh(mesh_);
        else
            return mesh_;
    }

    template <class Tuple, std::size_t... I>
    decltype(auto) invoke(Tuple& inputs, std::index_sequence<I...>) const {
        if constexpr (Local)
            return fn_(detail::local_of_arg(std::get<I>(inputs))...);
        else
            return fn_(std::get<I>(inputs)...);
    }

    template <class R>
    auto finish(R&& result, const detail::call_log& log, std::size_t inputs) const {
        using X = std::remove_cvref_t<R>;
        if constexpr (detail::is_tuple<X>::value) {
            return [&]<std::size_t... J>(std::index_sequence<J...>) {
                return std::make_tuple(
                    one_output<J>(std::get<J>(std::forward<R>(result)), log, inputs)...);
            }
            (std::make_index_sequence<std::tuple_size_v<X>>{});
        } else {
            return one_output<0>(std::forward<R>(result), log, inputs);
        }
    }

    template <std::size_t J, class R>
    auto one_output(R&& r, const detail::call_log& log, std::size_t inputs) const {
        const detail::slot what{"output", J, inputs + J};
        if constexpr (Local)
            return detail::wrap_local(mesh_, std::forward<R>(r), detail::spec_at<Out, J>(out_), log,
                                      what);
        else
            return detail::shard_output(mesh_, std::forward<R>(r), detail::spec_at<Out, J>(out_),
                                        log, what);
    }

    Mesh mesh_;
    F fn_;
    In in_;
    Out out_;
    std::optional<parameter_plan> plan_;
    int level_ = 0;
    bool trace_ = false;
    std::shared_ptr<std::string> report_;
    std::shared_ptr<detail::plan_cache> plans_; // the plans of each input and output
    std::shared_ptr<derivation_cache> derivations_;
    /// The last call's entry of `derivations_` (none before the first call).
    std::shared_ptr<const std::vector<std::optional<layout>>*> derived_;
};

namespace detail {

template <class O>
constexpr bool is_shard_option = std::is_same_v<O, auto_redistribute_t> ||
                                 std::is_same_v<O, parameter_plan> ||
                                 std::is_same_v<O, sharding_propagation>;

template <class O, class... Options>
constexpr int option_count = (0 + ... + int(std::is_same_v<O, Options>));

/// The sharded callable of shard() or shard_local() with options `options`.
template <bool Local, class Mesh, class F, class In, class Out, class... Options>
auto make_sharded(const Mesh& mesh, F fn, In in, Out out, Options... options) {
    static_assert((is_shard_option<Options> && ...),
                  "xshard: shard's options are xshard::auto_redistribute, a parameter_plan and "
                  "xshard::sharding_propagation{level}");
    static_assert(((option_count<Options, Options...> == 1) && ...),
                  "xshard: shard: give each option once");
    constexpr bool automatic = option_count<auto_redistribute_t, Options...> == 1;
    constexpr bool propagate = option_count<sharding_propagation, Options...> == 1;
    static_assert(!Local || !automatic,
                  "xshard: shard_local's callable works on local arrays: auto_redistribute is "
                  "for shard (global semantics)");
    static_assert(!Local || !propagate,
                  "xshard: sharding_propagation derives the layouts of shard (global semantics); "
                  "shard_local needs its specs");
    std::optional<parameter_plan> plan;
    int level = 0;
    (
        [&](Options& o) {
            if constexpr (std::is_same_v<Options, parameter_plan>)
                plan = std::move(o);
            else if constexpr (std::is_same_v<Options, sharding_propagation>)
                level = o.level;
        }(options),
        ...);
    return sharded<Mesh, F, In, Out, Local, automatic, propagate>(
        mesh, std::move(fn), std::move(in), std::move(out), std::move(plan), level);
}

} // namespace detail

/// shard(mesh, fn, in_specs [, out_specs] [, options...]): global semantics (see the file
/// comment). Options, in any order: xshard::auto_redistribute, a parameter_plan,
/// xshard::sharding_propagation{level}.
struct shard_fn {
    template <mesh_type Mesh, class F, class In, class Out = none_t, class... Options>
    auto operator()(const Mesh& mesh, F fn, In in, Out out = {}, Options... options) const {
        return detail::make_sharded<false>(mesh, std::move(fn), std::move(in), std::move(out),
                                           std::move(options)...);
    }
};

/// shard_local(mesh, fn, in_specs, out_specs [, parameter_plan]): local semantics (see the
/// file comment).
struct shard_local_fn {
    template <mesh_type Mesh, class F, class In, class Out, class... Options>
    auto operator()(const Mesh& mesh, F fn, In in, Out out, Options... options) const {
        return detail::make_sharded<true>(mesh, std::move(fn), std::move(in), std::move(out),
                                          std::move(options)...);
    }
};

inline constexpr shard_fn shard{};
inline constexpr shard_local_fn shard_local{};

} // namespace xshard
