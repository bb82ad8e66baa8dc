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
/// strategy). Inputs may be distributed tensors (redistributed to their spec; nothing
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
#include <xshard/core/strategy.hpp>
#include <xshard/ops/operand.hpp>
#include <xshard/redistribute/redistribute.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/dtensor.hpp>
#include <xshard/param/parameter.hpp>
#include <xshard/param/traversal.hpp>

#include <xtensor/xtensor.hpp>

#include <map>
#include <memory>
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
                l = dataset_layout(mesh, N, layout::replicated(N));
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

template <class T>
decltype(auto) local_of_arg(T&& x) {
    if constexpr (distributed_tensor<std::remove_cvref_t<T>>)
        return (std::forward<T>(x).local());
    else
        return std::forward<T>(x);
}

} // namespace detail

/// The callable shard() returns (see the file comment).
template <mesh_type Mesh, class F, class In, class Out, bool Local, bool Auto>
class sharded {
public:
    sharded(Mesh mesh, F fn, In in, Out out, std::optional<parameter_plan> plan)
        : mesh_(std::move(mesh))
        , fn_(std::move(fn))
        , in_(std::move(in))
        , out_(std::move(out))
        , plan_(std::move(plan))
        , report_(std::make_shared<std::string>())
        , plans_(std::make_shared<detail::plan_cache>()) {}

    /// Records, from the next call on, the layouts and redistributions of each call.
    sharded& traced(bool on = true) {
        trace_ = on;
        return *this;
    }

    /// The layouts of the last traced call's inputs and outputs and its redistribution steps.
    std::string describe() const { return *report_; }

    template <class... Args>
    auto operator()(Args&&... args) const {
        static_assert(std::tuple_size_v<In> == sizeof...(Args),
                      "xshard: shard: give one input spec per argument (xshard::none to keep one)");
        const detail::call_log log{trace_ ? report_.get() : nullptr, plans_.get()};
        if (log.report)
            log.report->clear();
        return call(log, std::index_sequence_for<Args...>{}, std::forward<Args>(args)...);
    }

private:
    using call_mesh = std::conditional_t<Auto, redistributing_mesh<Mesh>, Mesh>;

    template <std::size_t... I, class... Args>
    auto call(const detail::call_log& log, std::index_sequence<I...>, Args&&... args) const {
        const call_mesh cm = make_call_mesh();
        const parameter_plan* plan = plan_ ? &*plan_ : nullptr;
        // The prepared inputs, held by reference where nothing changes, by value otherwise.
        std::tuple<decltype(detail::shard_input(mesh_, cm, std::forward<Args>(args),
                                                std::get<I>(in_), plan, log,
                                                detail::slot{"input", I, I}))...>
            inputs{detail::shard_input(mesh_, cm, std::forward<Args>(args), std::get<I>(in_), plan,
                                       log, detail::slot{"input", I, I})...};
        // Agreed before any collective that follows: a callable that throws on some ranks
        // raises on every rank (its own exception where it threw, xshard::error naming the
        // rank elsewhere) instead of leaving the others in an output's redistribution.
        decltype(auto) result = agreed(mesh_.comm(), [&]() -> decltype(auto) {
            return invoke(inputs, std::index_sequence<I...>{});
        });
        return finish(std::forward<decltype(result)>(result), log, sizeof...(I));
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
    bool trace_ = false;
    std::shared_ptr<std::string> report_;
    std::shared_ptr<detail::plan_cache> plans_; // the plans of each input and output
};

/// shard(mesh, fn, in_specs [, out_specs] [, auto_redistribute] [, parameter_plan]): global
/// semantics (see the file comment).
struct shard_fn {
    template <mesh_type Mesh, class F, class In, class Out = none_t>
    auto operator()(const Mesh& mesh, F fn, In in, Out out = {}) const {
        return sharded<Mesh, F, In, Out, false, false>(mesh, std::move(fn), std::move(in),
                                                       std::move(out), std::nullopt);
    }
    template <mesh_type Mesh, class F, class In, class Out>
    auto operator()(const Mesh& mesh, F fn, In in, Out out, auto_redistribute_t) const {
        return sharded<Mesh, F, In, Out, false, true>(mesh, std::move(fn), std::move(in),
                                                      std::move(out), std::nullopt);
    }
    template <mesh_type Mesh, class F, class In, class Out>
    auto operator()(const Mesh& mesh, F fn, In in, Out out, parameter_plan plan) const {
        return sharded<Mesh, F, In, Out, false, false>(mesh, std::move(fn), std::move(in),
                                                       std::move(out), std::move(plan));
    }
    template <mesh_type Mesh, class F, class In, class Out>
    auto operator()(const Mesh& mesh, F fn, In in, Out out, auto_redistribute_t,
                    parameter_plan plan) const {
        return sharded<Mesh, F, In, Out, false, true>(mesh, std::move(fn), std::move(in),
                                                      std::move(out), std::move(plan));
    }
};

/// shard_local(mesh, fn, in_specs, out_specs [, parameter_plan]): local semantics (see the
/// file comment).
struct shard_local_fn {
    template <mesh_type Mesh, class F, class In, class Out>
    auto operator()(const Mesh& mesh, F fn, In in, Out out) const {
        return sharded<Mesh, F, In, Out, true, false>(mesh, std::move(fn), std::move(in),
                                                      std::move(out), std::nullopt);
    }
    template <mesh_type Mesh, class F, class In, class Out>
    auto operator()(const Mesh& mesh, F fn, In in, Out out, parameter_plan plan) const {
        return sharded<Mesh, F, In, Out, true, false>(mesh, std::move(fn), std::move(in),
                                                      std::move(out), std::move(plan));
    }
};

inline constexpr shard_fn shard{};
inline constexpr shard_local_fn shard_local{};

} // namespace xshard
