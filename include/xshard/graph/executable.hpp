#pragma once
/// \file
/// A program compiled onto a mesh: its weights, its planned redistributions and its arena,
/// ready to run forward and backward passes on this rank's shards.
///
///     auto net = xshard::compile<double>(program, mesh);     // collective, plans everything
///     std::cout << net.report();                             // layouts, moves, bytes per rank
///     auto logits = net.forward(x);                          // x: the input's dtensor
///     net.backward(dlogits);                                 // adds to the weights' grad
///     double loss = net.train_step(x, labels);               // a program that returns a loss
///
/// A compiled program is a parameter container (its weights, `xshard::weight`s named by the
/// program's dotted names), so parameter_broadcast, synchronize_gradients, norms, optimizers,
/// hsdp and checkpoints work on it unchanged, and it is a model for the training driver
/// (`forward(x)` and `backward(dy)`).
///
/// Every plan is built when the program is compiled. A step runs the schedule's flat list of
/// kernels and redistributions (graph/schedule.hpp) over one arena, allocating nothing but the
/// outputs it returns. Gradients follow the weights' convention (param/weight.hpp): a backward
/// pass adds each rank's terms to `grad`, which `synchronize_gradients` completes.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/graph/custom.hpp>
#include <xshard/graph/layouts.hpp>
#include <xshard/graph/primitive.hpp>
#include <xshard/graph/profile.hpp>
#include <xshard/graph/program.hpp>
#include <xshard/graph/registry.hpp>
#include <xshard/graph/schedule.hpp>
#include <xshard/param/initializer.hpp>
#include <xshard/param/weight.hpp>
#include <xshard/redistribute/plan.hpp>
#include <xshard/redistribute/redistribute.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace xshard {

/// How a program is compiled onto a mesh.
struct compile_options {
    /// The seed the weights are drawn with (param/initializer.hpp: the same values on any
    /// mesh or world size).
    std::uint64_t seed = 0;
    /// Whether backward passes also give the inputs' cotangents (`input_gradient`).
    bool input_gradients = false;
    /// The dataset's axes and the inputs' layouts (graph/layouts.hpp).
    layout_options layouts = {};
    /// Scopes recomputed in the backward pass (activation checkpointing; MindSpore's
    /// `Cell.recompute()`, PyTorch's `checkpoint`): the `name_scope`s, by dotted name
    /// ("block0", "backbone.layer1"), whose nodes keep nothing from the forward pass. Their
    /// forward steps run again just before their VJPs, so the arena holds one scope's
    /// activations at a time, for one more forward pass of each scope. An entry "a..b" is a
    /// run recomputed as one: the nodes from the first of scope (or node) a to the last of
    /// b, in the program's order ("conv1..max_pool2d": a stem outside every scope). The
    /// gradients are the same. An entry that names no node raises.
    std::vector<std::string> recompute = {};
};

/// A redistribution of one buffer into another, planned once.
struct planned_move {
    std::function<void(const void*, void*)> run;
    plan_summary summary;
    layout from, to;
    value_shape shape;
};

namespace detail {

/// A scalar's (rank 0) redistribution: pending sums it drops are all-reduced, pending sums
/// it gains keep the value on one rank of their axes (zeros elsewhere).
template <class E>
planned_move scalar_move(const mesh_view& mesh, const layout& from, const layout& to) {
    planned_move m{{}, {}, from, to, {}};
    const axis_set had = from.partial_axes(mesh.shape), has = to.partial_axes(mesh.shape);
    const axis_set reduce = had - has, gain = has - had;
    bool keeps = true;
    for (std::size_t a = 0; a < mesh.shape.ndim(); ++a)
        if (gain.contains(a) && mesh.coords[a] != 0)
            keeps = false;
    const mesh_view* mv = &mesh;
    m.run = [mv, reduce, keeps](const void* in, void* out) {
        E v = *static_cast<const E*>(in);
        if (!reduce.empty())
            allreduce(mv->group(reduce), std::span(&v, 1), reduction::sum);
        *static_cast<E*>(out) = keeps ? v : E(0);
    };
    return m;
}

template <class E, std::size_t N, class Mesh>
planned_move typed_move(const Mesh& mesh, const value_shape& shape, const layout& from,
                        const layout& to) {
    std::array<std::size_t, N> s{};
    for (std::size_t d = 0; d < N; ++d)
        s[d] = shape[d];
    auto plan = std::make_shared<redistribution_plan<E, N>>(mesh, s, from, to);
    planned_move m{{}, plan->summary(), from, to, shape};
    m.run = [plan](const void* in, void* out) {
        plan->execute(static_cast<const E*>(in), static_cast<E*>(out));
    };
    return m;
}

/// A planned redistribution of elements E of global `shape` from `from` to `to`.
template <class E, class Mesh>
planned_move make_move(const Mesh& mesh, const mesh_view& view, const value_shape& shape,
                       const layout& from, const layout& to) {
    switch (shape.size()) {
    case 0:
        return scalar_move<E>(view, from, to);
    case 1:
        return typed_move<E, 1>(mesh, shape, from, to);
    case 2:
        return typed_move<E, 2>(mesh, shape, from, to);
    case 3:
        return typed_move<E, 3>(mesh, shape, from, to);
    case 4:
        return typed_move<E, 4>(mesh, shape, from, to);
    default:
        throw error("xshard: a program value has " + std::to_string(shape.size()) +
                    " dimensions; programs hold values of at most 4");
    }
}

/// `l` without pending sums over axes of one rank.
inline layout without_unit_axes(const layout& l, const mesh_shape& mesh) {
    return without_unit_sums(l, mesh);
}

/// The pointer bound for a shard's storage: `p`, or for an empty shard (xtensor gives an
/// empty container a null data pointer) a valid pointer no kernel dereferences, since a null
/// cotangent means "not wanted" to a VJP (graph/primitive.hpp) and a VJP that skips its
/// collectives on one rank would leave the others waiting.
inline void* bound_pointer(const void* p) {
    alignas(64) static std::byte empty[64];
    return p ? const_cast<void*>(p) : static_cast<void*>(empty);
}

/// `y`, its pending sums resolved (redistributed to its layout without them).
template <distributed_tensor D>
D without_pending_sums(D y) {
    if (y.layout().partial.empty())
        return y;
    layout whole = y.layout();
    whole.partial = {};
    return redistribute<D::static_layout>(y, whole);
}

/// What a step's kernel call reads and writes, filled from the pointer table at each run.
struct step_pointers {
    std::vector<const void*> operands, results, result_cotangents;
    std::vector<void*> outputs, operand_cotangents;
    std::unique_ptr<bool[]> accumulate; // (std::vector<bool> gives no span)
    std::size_t accumulate_count = 0;
};

} // namespace detail

/// A program compiled onto a mesh of type Mesh with floating element type T (see the file
/// comment). Movable and copyable: a copy is the same program compiled again on the same mesh
/// (no message), with copies of the weights and an arena of its own, so copies can hold the
/// activations of different batches at once (a pipeline's micro-batches in flight).
///
/// Compiled from the traced function itself (`compile<T>(fn, mesh, options, inputs...)`), it
/// runs on inputs of any shape: a forward pass on shapes it has not seen traces `fn` again for
/// them and compiles that program (once per shape, kept), with the current program's
/// annotations by node name and the same options, and the weights move over to it (the same
/// objects: nothing holding a weight notices). Every other method speaks of the program of the
/// last forward pass's shapes.
template <class T, mesh_type Mesh>
class compiled_program {
public:
    /// A weight of rank N.
    template <std::size_t N>
    using weight_type = weight<dtensor<T, Mesh, dynamic_layout(N)>>;
    using any_weight = std::variant<weight_type<1>, weight_type<2>, weight_type<3>, weight_type<4>>;

    /// Compiles `p` onto `mesh`: lays it out (graph/layouts.hpp), schedules it
    /// (graph/schedule.hpp), plans every redistribution, makes and initialises the weights and
    /// sizes the arena. Collective over the mesh (every rank makes the same plans; no
    /// message unless a plan's setup needs one). Raises xshard::error on every rank alike for
    /// what does not fit.
    compiled_program(program p, const Mesh& mesh, compile_options options = {})
        : s_(std::make_unique<state>(std::move(p), mesh, std::move(options))) {
        s_->build();
    }

    /// A copy (see the class comment). Each custom-VJP node runs a copy of its layer
    /// (custom_kernels::clone: copies of its weights, its activations apart); a layer that
    /// cannot be copied raises naming the node.
    compiled_program(const compiled_program& o)
        : s_(std::make_unique<state>(with_cloned_customs(o.s_->prog), o.s_->mesh, o.s_->options)) {
        s_->build(&o.s_->weights);
        s_->profile_steps(o.s_->profiling);
        retrace_ = o.retrace_;
    }
    compiled_program(compiled_program&&) noexcept = default;
    compiled_program& operator=(const compiled_program& o) {
        if (this != &o)
            *this = compiled_program(o);
        return *this;
    }
    compiled_program& operator=(compiled_program&&) noexcept = default;

    /// The program as traced.
    const program& source() const noexcept { return s_->prog; }
    /// The options it was compiled with.
    const compile_options& options() const noexcept { return s_->options; }
    /// The layouts of every value and node.
    const program_layouts& layouts() const noexcept { return s_->lay; }
    /// The mesh.
    const Mesh& mesh() const noexcept { return s_->mesh; }

    /// Runs the forward pass on `inputs` (one distributed tensor per program input, in order,
    /// of the input's global shape; in any layout: an input laid out otherwise than the
    /// program's input layout is redistributed first, with a plan kept for the next call).
    /// Collective. Read the outputs with `output` / `scalar_output`.
    template <distributed_tensor... D>
    void run(const D&... inputs) {
        if (retrace_)
            take_shapes({value_shape(inputs.shape().begin(), inputs.shape().end())...});
        s_->bind_inputs(inputs...);
        s_->run_forward();
    }

    /// Makes the program remember `retrace` (the traced function, on input specs of other
    /// shapes), so that forward passes take inputs of any shape (see the class comment);
    /// `compile<T>(fn, mesh, options, inputs...)` sets it.
    void retrace_with(std::function<program(const std::vector<input_spec>&)> retrace) {
        retrace_ = std::make_shared<const std::function<program(const std::vector<input_spec>&)>>(
            std::move(retrace));
        others_.clear();
    }

    /// The input shapes the program is compiled for now, and how many other shapes it has
    /// kept compiled.
    std::vector<value_shape> input_shapes() const {
        std::vector<value_shape> out;
        for (auto id : s_->prog.inputs())
            out.push_back(s_->prog.value(id).shape);
        return out;
    }
    std::size_t other_shapes() const noexcept { return others_.size(); }

    /// The forward pass on `inputs`, returning the first output (of rank 2) with its pending
    /// sums resolved (an all-reduce where the program keeps it partial: a loss reads whole
    /// values): what the training driver calls.
    template <distributed_tensor... D>
    dtensor<T, Mesh, dynamic_layout(2)> forward(const D&... inputs) {
        run(inputs...);
        return detail::without_pending_sums(output<2>(0));
    }

    /// The forward pass of a program whose first output is a scalar (a loss): its value,
    /// the same on every rank.
    template <distributed_tensor... D>
    double forward_scalar(const D&... inputs) {
        run(inputs...);
        return scalar_output(0);
    }

    /// Output `i` of the last forward pass, a copy laid out as the program keeps it. Throws
    /// xshard::error when it does not have N dimensions.
    template <std::size_t N>
    dtensor<T, Mesh, dynamic_layout(N)> output(std::size_t i = 0) const {
        const auto& sl = s_->output_slot(i);
        if (sl.shard.rank() != N)
            throw error("xshard: compiled_program: output " + std::to_string(i) + " has " +
                        std::to_string(sl.shard.rank()) + " dimensions, not " + std::to_string(N));
        using D = dtensor<T, Mesh, dynamic_layout(N)>;
        std::array<std::size_t, N> g{}, l{};
        for (std::size_t d = 0; d < N; ++d) {
            g[d] = sl.shard.global[d];
            l[d] = sl.shard.local[d];
        }
        auto local = D::local_type::from_shape(l);
        std::memcpy(local.data(), s_->pointer(s_->sched.output_slot[i]), sl.bytes);
        return D(detail::unchecked, s_->mesh, g, std::move(local), sl.shard.l);
    }

    /// Output `i` (a scalar) of the last forward pass, its pending sums resolved: the same on
    /// every rank. Collective when it is a pending sum (one all-reduce of one value).
    double scalar_output(std::size_t i = 0) const {
        const auto& sl = s_->output_slot(i);
        if (sl.shard.rank() != 0)
            throw error("xshard: compiled_program: output " + std::to_string(i) + " " +
                        shape_text(sl.shard.global) + " is not a scalar");
        T v = *static_cast<const T*>(s_->pointer(s_->sched.output_slot[i]));
        const auto axes = sl.shard.l.partial_axes(s_->view.shape);
        if (!axes.empty())
            allreduce(s_->view.group(axes), std::span(&v, 1), reduction::sum);
        return double(v);
    }

    /// The backward pass of the last forward pass, seeded with `dy`, the cotangent of the
    /// first output (in any layout of its shape; redistributed to the output's cotangent
    /// layout when needed): adds every weight's gradient terms. Collective.
    template <distributed_tensor G>
    void backward(const G& dy) {
        s_->seed_output(0, dy);
        s_->run_backward();
    }

    /// The backward pass of a program whose outputs are scalars (losses): each seeded with 1.
    void backward() {
        s_->seeds.assign(s_->sched.output_slot.size(), nullptr);
        s_->run_backward();
    }

    /// One forward and backward pass of a loss program: returns the loss (output 0).
    template <distributed_tensor... D>
    double train_step(const D&... inputs) {
        const double loss = forward_scalar(inputs...);
        backward();
        return loss;
    }

    /// The cotangent of input `i` after a backward pass (compile_options::input_gradients).
    template <std::size_t N>
    dtensor<T, Mesh, dynamic_layout(N)> input_gradient(std::size_t i) const {
        const auto c = s_->sched.input_cotangent.at(i);
        if (c == detail::no_slot)
            throw error("xshard: compiled_program: no gradient of input " + std::to_string(i) +
                        " (compile with input_gradients = true; integer inputs have none)");
        const auto& sl = s_->sched.slots[c];
        using D = dtensor<T, Mesh, dynamic_layout(N)>;
        std::array<std::size_t, N> g{}, l{};
        for (std::size_t d = 0; d < N; ++d) {
            g[d] = sl.shard.global[d];
            l[d] = sl.shard.local[d];
        }
        auto local = D::local_type::from_shape(l);
        std::memcpy(local.data(), s_->pointer(c), sl.bytes);
        return D(detail::unchecked, s_->mesh, g, std::move(local), sl.shard.l);
    }

    /// The listing: every node with its operands' and results' layouts (and the bytes its
    /// halos send, over a split height or width), then every redistribution with its steps
    /// and bytes per rank.
    std::string describe() const { return s_->describe(); }

    /// What this rank holds: parameter, gradient and optimizer-state bytes (per state slot),
    /// the arena (peak activations and cotangents), and the bytes each redistribution and the
    /// halos send.
    std::string report() const { return s_->report(); }

    /// Starts timing every step of the passes that follow, node by node, from zero (`on`),
    /// or stops it. Each step then reads the clock twice (tens of nanoseconds). Local: no
    /// communication.
    void profile_steps(bool on = true) { s_->profile_steps(on); }

    /// The seconds per node since `profile_steps()` (graph/profile.hpp); empty when it was
    /// never called.
    const program_profile& profile() const noexcept { return s_->prof; }

    /// Bytes of this rank's arena: every activation, cotangent and redistributed copy at
    /// their peak.
    std::size_t arena_bytes() const noexcept { return s_->sched.arena_bytes; }

    /// Lays the named weights out as `planned` (a parameter plan, or a strategy file's
    /// layouts, on a compiled program; train/lay_out.hpp calls it): `recompile` with them
    /// added to `layouts.weight_layouts`. Nothing happens when they are there already.
    void lay_out_weights(const std::map<std::string, layout>& planned) {
        auto o = options();
        for (const auto& [name, l] : planned)
            o.layouts.weight_layouts[name] = l;
        if (o.layouts.weight_layouts == options().layouts.weight_layouts)
            return;
        recompile(source(), std::move(o));
    }

    /// Compiles `p` (this program, or it with strategies applied, program_strategy::apply)
    /// again on this mesh with `o` (other input or weight layouts, say), then gives every
    /// weight of the new program that this one has by name its current value, redistributed
    /// where its layout changed: trained or loaded values survive a new layout. Gradients
    /// start as zero terms and optimizer state is made again. A layout that does not fit
    /// raises on every rank before anything changes. Collective over the mesh.
    void recompile(program p, compile_options o) {
        replace(compiled_program(std::move(p), mesh(), std::move(o)));
    }

    /// Becomes `next` (a program compiled on this mesh: this one compiled otherwise, say),
    /// giving each of its weights that this one has by name this one's value, as `recompile`
    /// does; what compiles several programs before it commits to any compiles each once so.
    /// Collective over the mesh.
    void replace(compiled_program next) {
        next.retrace_ = retrace_; // other shapes compile again with the new annotations
        using any_value =
            std::variant<dtensor<T, Mesh, dynamic_layout(1)>, dtensor<T, Mesh, dynamic_layout(2)>,
                         dtensor<T, Mesh, dynamic_layout(3)>, dtensor<T, Mesh, dynamic_layout(4)>>;
        std::map<std::string, any_value> values;
        visit_parameters(*this,
                         [&](const std::string& name, auto& w) { values.emplace(name, w.value); });
        // Both programs visit their weights in the same order on every rank.
        visit_parameters(next, [&]<class D>(const std::string& name, weight<D>& w) {
            const auto it = values.find(name);
            if (it == values.end())
                return;
            if (const auto* v = std::get_if<D>(&it->second))
                w.value = redistribute<D::static_layout>(*v, w.value.layout());
        });
        *this = std::move(next);
    }

    /// The weights, by the program's names (parameter traversal, param/traversal.hpp), then
    /// those of its custom nodes ("<node>.<weight>").
    friend void visit_parameters(compiled_program& c, auto&& visit) {
        const named_weights list = c.weights_by_name();
        for (const auto& named : list.refs)
            std::visit([&](auto* p) { visit(*named.first, *p); }, named.second);
    }

private:
    /// The weights `visit_parameters` visits, in its order, with their names: the program's
    /// own names, and the custom nodes' "<node>.<weight>" joined once per visit.
    struct named_weights {
        std::deque<std::string> joined;
        std::vector<std::pair<const std::string*, weight_ref<T, Mesh>>> refs;
    };

    /// Built once per visit, so that a visitor is compiled once per weight type, not once
    /// more for the custom nodes' weights.
    named_weights weights_by_name() {
        named_weights out;
        for (std::size_t i = 0; i < s_->weights.size(); ++i)
            std::visit([&](auto& w) { out.refs.emplace_back(&s_->weight_name(i), &w); },
                       s_->weights[i]);
        for (std::size_t n = 0; n < s_->customs.size(); ++n)
            if (s_->customs[n])
                s_->customs[n]->visit_weights(
                    [&](const std::string& name, weight_ref<T, Mesh> w) {
                        out.joined.push_back(s_->prog.nodes()[n].name + "." + name);
                        out.refs.emplace_back(&out.joined.back(), w);
                    });
        return out;
    }

    struct state {
        program prog;
        Mesh mesh;
        compile_options options;
        mesh_view view;
        program_layouts lay;
        detail::schedule sched;
        std::deque<any_weight> weights;
        std::vector<planned_move> moves;
        std::vector<detail::step_pointers> fwd_ptrs, bwd_ptrs;
        std::vector<const primitive<T>*> prims;
        std::vector<const custom_kernels<T, Mesh>*> customs;
        std::unique_ptr<std::byte[]> arena;
        std::vector<void*> ptr;
        // Inputs laid out otherwise than the program's: the plan and the staging buffer.
        struct staging {
            std::optional<planned_move> move;
            std::vector<std::byte> buffer;
        };
        std::vector<staging> input_staging;
        std::vector<const void*> seeds;
        staging seed_staging;
        // Profiling (profile_steps): per forward and backward step, the node it is charged to.
        bool profiling = false;
        program_profile prof;
        std::vector<std::size_t> fwd_owner, bwd_owner;

        state(program p, const Mesh& m, compile_options o)
            : prog(std::move(p))
            , mesh(m)
            , options(std::move(o)) {
            view.shape = mesh.shape();
            view.rank = mesh.rank();
            view.coords = mesh.coords();
            const Mesh* mp = &mesh;
            view.group = [mp](axis_set axes) -> const communicator& {
                return mp->sub(axes);
            };
        }

        /// Lays out, schedules and plans the program, and makes its weights: drawn, copies of
        /// `weights_from` (another compilation's of the same program), or none (`draw`
        /// false: another compilation's move in).
        void build(const std::deque<any_weight>* weights_from = nullptr, bool draw = true) {
            check_types();
            lay = assign_layouts(prog, view.shape, options.layouts);
            sched = detail::schedule_builder(prog, lay, view, options.input_gradients,
                                             options.recompute,
                                             !options.layouts.weight_shard_axes.empty())
                        .build();
            for (const auto& n : prog.nodes()) {
                prims.push_back(n.custom ? nullptr : &detail::primitive_named<T>(n.op));
                customs.push_back(dynamic_cast<const custom_kernels<T, Mesh>*>(n.custom.get()));
                if (n.custom && !customs.back())
                    throw error("xshard: compile: the custom node " + n.name +
                                " was made for another element type or mesh type");
                // Scratch and state that live with the program (a max-pool's argmax
                // indices, a window's halo plan).
                const auto* k = prims.back();
                auto& shards = sched.nodes[prims.size() - 1];
                if (k && k->scratch_bytes)
                    shards.scratch.resize(k->scratch_bytes(shards));
                if (k && k->prepare)
                    k->prepare(shards);
            }
            for (const auto& m : sched.moves) {
                const auto& from = sched.slots[m.from].shard;
                const auto& to = sched.slots[m.to].shard;
                moves.push_back(
                    from.type == dtype::i64
                        ? detail::make_move<std::int64_t>(mesh, view, from.global, from.l, to.l)
                        : detail::make_move<T>(mesh, view, from.global, from.l, to.l));
            }
            if (weights_from)
                weights = *weights_from;
            else if (draw)
                make_weights();
            // Left uninitialised: pages are touched (and faulted in) only where slots are used.
            arena = std::make_unique_for_overwrite<std::byte[]>(sched.arena_bytes + 64);
            std::byte* base = arena.get();
            base += (64 - reinterpret_cast<std::uintptr_t>(base) % 64) % 64;
            ptr.assign(sched.slots.size(), nullptr);
            for (std::size_t i = 0; i < sched.slots.size(); ++i)
                if (sched.slots[i].home == detail::buffer_home::arena)
                    ptr[i] = base + sched.slots[i].offset;
            fwd_ptrs = pointers_for(sched.forward);
            bwd_ptrs = pointers_for(sched.backward);
            input_staging.resize(prog.inputs().size());
        }

        void check_types() const {
            for (const auto& v : prog.values())
                if (v.type != dtype::i64 && v.type != dtype_for<T>())
                    throw error("xshard: compile: the program holds " +
                                std::string(to_string(v.type)) + " values (" +
                                (v.name.empty() ? std::string("a result") : v.name) +
                                ") but is compiled for " + std::string(to_string(dtype_for<T>())));
        }

        std::vector<detail::step_pointers>
        pointers_for(const std::vector<detail::program_step>& steps) {
            std::vector<detail::step_pointers> out(steps.size());
            for (std::size_t i = 0; i < steps.size(); ++i) {
                const auto& st = steps[i];
                auto& p = out[i];
                p.operands.resize(st.operands.size());
                p.results.resize(st.results.size());
                p.outputs.resize(st.results.size());
                p.result_cotangents.resize(st.result_cotangents.size());
                p.operand_cotangents.resize(st.operand_cotangents.size());
                p.accumulate_count = st.accumulate.size();
                p.accumulate = std::make_unique<bool[]>(st.accumulate.size() + 1);
                for (std::size_t k = 0; k < st.accumulate.size(); ++k)
                    p.accumulate[k] = st.accumulate[k];
            }
            return out;
        }

        template <std::size_t N>
        any_weight make_weight(const program_value& v, const layout& l) {
            using D = dtensor<T, Mesh, dynamic_layout(N)>;
            std::array<std::size_t, N> g{};
            for (std::size_t d = 0; d < N; ++d)
                g[d] = v.shape[d];
            const auto b = block_of(l, view.shape, g, view.coords);
            D t(detail::unchecked, mesh, g, D::local_type::from_shape(b.extent), l);
            initialize(t, v.init, options.seed, parameter_stream(v.name));
            return any_weight(std::in_place_type<weight_type<N>>, std::move(t));
        }

        void make_weights() {
            for (auto id : prog.weights()) {
                const auto& v = prog.value(id);
                const auto& l = lay.values[id];
                switch (v.shape.size()) {
                case 1:
                    weights.push_back(make_weight<1>(v, l));
                    break;
                case 2:
                    weights.push_back(make_weight<2>(v, l));
                    break;
                case 3:
                    weights.push_back(make_weight<3>(v, l));
                    break;
                case 4:
                    weights.push_back(make_weight<4>(v, l));
                    break;
                default:
                    throw error("xshard: compile: the weight " + v.name + " has " +
                                std::to_string(v.shape.size()) +
                                " dimensions; programs hold weights of 1 to 4");
                }
            }
        }

        const std::string& weight_name(std::size_t i) const {
            return prog.value(prog.weights()[i]).name;
        }

        const detail::buffer_slot& output_slot(std::size_t i) const {
            if (i >= sched.output_slot.size())
                throw error("xshard: compiled_program: the program has " +
                            std::to_string(sched.output_slot.size()) + " outputs, not " +
                            std::to_string(i + 1));
            return sched.slots[sched.output_slot[i]];
        }

        const void* pointer(std::size_t slot) const { return ptr[slot]; }

        /// Binds input `i` to `x`'s shard, through a redistribution into the input's
        /// layout when `x` is laid out otherwise.
        template <class D>
        void bind_input(std::size_t i, const D& x) {
            using E = typename D::value_type;
            const auto& sl = sched.slots[sched.input_slot[i]];
            const auto& v = prog.value(prog.inputs()[i]);
            const bool integer = v.type == dtype::i64;
            const bool fits =
                integer ? std::is_integral_v<E> && sizeof(E) == 8 : std::is_same_v<E, T>;
            value_shape shape(x.shape().begin(), x.shape().end());
            if (!fits || shape != v.shape)
                throw error("xshard: compiled_program: input " + v.name + " takes " +
                            std::string(to_string(v.type)) + shape_text(v.shape) + ", not " +
                            std::string(to_string(dtype_for<E>())) + shape_text(shape));
            if (!(x.mesh() == mesh))
                throw error("xshard: compiled_program: input " + v.name +
                            " lives on another mesh than the program");
            if (detail::without_unit_axes(x.layout(), view.shape) ==
                detail::without_unit_axes(sl.shard.l, view.shape)) {
                ptr[sched.input_slot[i]] = detail::bound_pointer(x.local().data());
                return;
            }
            auto& st = input_staging[i];
            if (!st.move || !(st.move->from == x.layout()))
                st.move = detail::make_move<E>(mesh, view, v.shape, x.layout(), sl.shard.l);
            st.buffer.resize(sl.bytes);
            st.move->run(x.local().data(), st.buffer.data());
            ptr[sched.input_slot[i]] = detail::bound_pointer(st.buffer.data());
        }

        template <class... D>
        void bind_inputs(const D&... xs) {
            if (sizeof...(D) != prog.inputs().size())
                throw error("xshard: compiled_program: the program takes " +
                            std::to_string(prog.inputs().size()) + " inputs, not " +
                            std::to_string(sizeof...(D)));
            std::size_t i = 0;
            (bind_input(i++, xs), ...);
        }

        /// The weights' shards (their storage may move between steps: optimizers and loads
        /// replace it).
        void bind_weights() {
            for (std::size_t i = 0; i < weights.size(); ++i) {
                const auto sl = sched.weight_slot[i];
                std::visit(
                    [&](auto& w) {
                        check_weight(i, w.value.layout(), sl);
                        ptr[sl] = detail::bound_pointer(w.value.local().data());
                    },
                    weights[i]);
            }
        }

        void check_weight(std::size_t i, const layout& l, std::size_t sl) const {
            if (!(l == sched.slots[sl].shard.l))
                throw error("xshard: compiled_program: the weight " + weight_name(i) +
                            " is laid out " + l.to_string() +
                            " but the program was compiled with " +
                            sched.slots[sl].shard.l.to_string());
        }

        void bind_gradients() {
            for (std::size_t i = 0; i < weights.size(); ++i) {
                const auto c = sched.weight_gradient[i];
                if (c == detail::no_slot)
                    continue;
                std::visit(
                    [&](auto& w) { ptr[c] = detail::bound_pointer(w.terms().local().data()); },
                    weights[i]);
            }
        }

        template <class G>
        void seed_output(std::size_t i, const G& dy) {
            static_assert(std::is_same_v<typename G::value_type, T>,
                          "xshard: compiled_program::backward: the cotangent's element type is "
                          "not the program's");
            seeds.assign(sched.output_slot.size(), nullptr);
            const auto c = sched.output_cotangent.at(i);
            if (c == detail::no_slot)
                return;
            const auto& sl = sched.slots[c];
            value_shape shape(dy.shape().begin(), dy.shape().end());
            if (shape != sl.shard.global || !(dy.mesh() == mesh))
                throw error("xshard: compiled_program::backward: the cotangent " +
                            shape_text(shape) + " does not match output " + std::to_string(i) +
                            " " + shape_text(sl.shard.global));
            if (detail::without_unit_axes(dy.layout(), view.shape) == sl.shard.l) {
                seeds[i] = detail::bound_pointer(dy.local().data());
                return;
            }
            auto& st = seed_staging;
            if (!st.move || !(st.move->from == dy.layout()))
                st.move = detail::make_move<T>(mesh, view, shape, dy.layout(), sl.shard.l);
            st.buffer.resize(sl.bytes);
            st.move->run(dy.local().data(), st.buffer.data());
            seeds[i] = detail::bound_pointer(st.buffer.data());
        }

        void run_forward() {
            bind_weights();
            run_steps(sched.forward, fwd_ptrs, fwd_owner, &node_time::forward);
            prof.forward_passes += profiling;
        }

        void run_backward() {
            bind_weights();
            bind_gradients();
            run_steps(sched.backward, bwd_ptrs, bwd_owner, &node_time::backward);
            prof.backward_passes += profiling;
        }

        void run_steps(const std::vector<detail::program_step>& steps,
                       std::vector<detail::step_pointers>& ptrs,
                       const std::vector<std::size_t>& owner, double node_time::*pass) {
            if (!profiling) {
                for (std::size_t i = 0; i < steps.size(); ++i)
                    run_step(steps[i], ptrs[i]);
                return;
            }
            using clock = std::chrono::steady_clock;
            for (std::size_t i = 0; i < steps.size(); ++i) {
                const auto t0 = clock::now();
                run_step(steps[i], ptrs[i]);
                const double dt = std::chrono::duration<double>(clock::now() - t0).count();
                const auto kind = steps[i].kind;
                auto& n = prof.nodes[owner[i]];
                if (kind == detail::program_step_kind::kernel ||
                    kind == detail::program_step_kind::vjp)
                    n.*pass += dt;
                else
                    n.redistribution += dt;
            }
        }

        void profile_steps(bool on) {
            profiling = on && !prog.nodes().empty();
            if (!profiling)
                return;
            prof = {};
            for (const auto& n : prog.nodes())
                prof.nodes.push_back({n.name, n.op, 0, 0, 0});
            fwd_owner = step_owners(sched.forward, false);
            bwd_owner = step_owners(sched.backward, true);
        }

        // The node each step is charged to (graph/profile.hpp): its own for a kernel or a
        // VJP; for a redistribution, the next kernel in the forward pass and the VJP before
        // it in the backward pass, else the nearest on the other side.
        static std::vector<std::size_t> step_owners(const std::vector<detail::program_step>& steps,
                                                    bool backward) {
            const std::size_t none = std::size_t(-1);
            std::vector<std::size_t> before(steps.size(), none), after(steps.size(), none);
            const auto computes = [&](std::size_t i) {
                return steps[i].kind == detail::program_step_kind::kernel ||
                       steps[i].kind == detail::program_step_kind::vjp;
            };
            for (std::size_t i = 0, last = none; i < steps.size(); ++i)
                before[i] = last = computes(i) ? steps[i].node : last;
            for (std::size_t i = steps.size(), next = none; i-- > 0;)
                after[i] = next = computes(i) ? steps[i].node : next;
            std::vector<std::size_t> owner(steps.size(), 0);
            for (std::size_t i = 0; i < steps.size(); ++i) {
                const auto first = backward ? before[i] : after[i];
                const auto second = backward ? after[i] : before[i];
                owner[i] = first != none ? first : second != none ? second : 0;
            }
            return owner;
        }

        void run_step(const detail::program_step& st, detail::step_pointers& p) {
            using detail::program_step_kind;
            switch (st.kind) {
            case program_step_kind::kernel: {
                for (std::size_t k = 0; k < st.operands.size(); ++k)
                    p.operands[k] = ptr[st.operands[k]];
                for (std::size_t k = 0; k < st.results.size(); ++k)
                    p.outputs[k] = ptr[st.results[k]];
                const forward_args args{sched.nodes[st.node], p.operands, p.outputs};
                if (customs[st.node])
                    customs[st.node]->forward(args);
                else
                    prims[st.node]->forward(args);
                return;
            }
            case program_step_kind::move:
                moves[st.move].run(ptr[st.operands[0]], ptr[st.results[0]]);
                return;
            case program_step_kind::add: {
                const T* a = static_cast<const T*>(ptr[st.operands[0]]);
                T* b = static_cast<T*>(ptr[st.results[0]]);
                const std::size_t n = sched.slots[st.results[0]].shard.count();
                for (std::size_t k = 0; k < n; ++k)
                    b[k] += a[k];
                return;
            }
            case program_step_kind::seed:
                run_seed(st);
                return;
            case program_step_kind::vjp:
                run_vjp(st, p);
                return;
            }
        }

        void run_seed(const detail::program_step& st) {
            const auto c = st.results[0];
            const auto& sl = sched.slots[c];
            T* out = static_cast<T*>(ptr[c]);
            const std::size_t n = sl.shard.count();
            const T* given =
                st.output < seeds.size() ? static_cast<const T*>(seeds[st.output]) : nullptr;
            if (!given && sl.shard.rank() != 0)
                throw error("xshard: compiled_program::backward: output " +
                            std::to_string(st.output) + " " + shape_text(sl.shard.global) +
                            " is not a scalar: pass its cotangent to backward(dy)");
            for (std::size_t k = 0; k < n; ++k) {
                T v = given ? given[k]
                            : (holds_term(sl.shard.l, view.shape, view.coords) ? T(1) : T(0));
                out[k] = st.accumulate[0] ? out[k] + v : v;
            }
        }

        void run_vjp(const detail::program_step& st, detail::step_pointers& p) {
            for (std::size_t k = 0; k < st.operands.size(); ++k)
                p.operands[k] = st.saved_operands[k] ? ptr[st.operands[k]] : nullptr;
            for (std::size_t k = 0; k < st.results.size(); ++k) {
                p.results[k] = st.saved_results[k] ? ptr[st.results[k]] : nullptr;
                p.result_cotangents[k] = st.result_cotangents[k] == detail::no_slot
                                             ? nullptr
                                             : ptr[st.result_cotangents[k]];
            }
            for (std::size_t k = 0; k < st.operand_cotangents.size(); ++k)
                p.operand_cotangents[k] = st.operand_cotangents[k] == detail::no_slot
                                              ? nullptr
                                              : ptr[st.operand_cotangents[k]];
            const std::span<const bool> acc(p.accumulate.get(), p.accumulate_count);
            const vjp_args args{sched.nodes[st.node], p.operands,           p.results,
                                p.result_cotangents,  p.operand_cotangents, acc};
            if (customs[st.node])
                customs[st.node]->vjp(args);
            else
                prims[st.node]->vjp(args);
        }

        static bool holds_term(const layout& l, const mesh_shape& ms, const mesh_coords& c) {
            for (const auto& a : l.partial)
                if (c[ms.index(a)] != 0)
                    return false;
            return true;
        }

        std::string slot_text(std::size_t s) const {
            const auto& sl = sched.slots[s];
            return std::string(to_string(sl.shard.type)) + shape_text(sl.shard.global) + " " +
                   sl.shard.l.to_string();
        }

        std::string describe() const {
            std::string out;
            for (std::size_t i = 0; i < prog.nodes().size(); ++i) {
                const auto& n = prog.nodes()[i];
                const auto& c = lay.nodes[i];
                out += n.name + " = " + n.op + "(";
                for (std::size_t k = 0; k < n.operands.size(); ++k)
                    out += (k ? ", " : "") + prog.value_name(n.operands[k]) + " " +
                           c.operands[k].to_string();
                out += ") -> ";
                for (std::size_t k = 0; k < n.results.size(); ++k)
                    out += (k ? ", " : "") + c.results[k].to_string();
                if (!n.annotation.empty())
                    out += "   shard " + n.annotation.to_string();
                if (sched.nodes[i].kernel_bytes > 0)
                    out += "   halos send " + std::to_string(sched.nodes[i].kernel_bytes) +
                           " bytes per rank";
                out += "\n";
            }
            for (std::size_t m = 0; m < moves.size(); ++m) {
                const auto& req = sched.moves[m];
                out += std::string(req.adjoint ? "backward " : "forward ") + "redistribution of " +
                       prog.value_name(sched.slots[req.from].value) +
                       (req.adjoint ? " (cotangent)" : "") + ": " + moves[m].from.to_string() +
                       " -> " + moves[m].to.to_string() + ", sends " +
                       std::to_string(moves[m].summary.bytes_sent()) + " bytes per rank\n";
            }
            return out;
        }

        std::string report() const {
            std::size_t params = 0;
            for (const auto& w : weights)
                std::visit([&](const auto& x) { params += x.value.local().size() * sizeof(T); }, w);
            std::size_t sent_fwd = 0, sent_bwd = 0;
            for (std::size_t m = 0; m < moves.size(); ++m)
                (sched.moves[m].adjoint ? sent_bwd : sent_fwd) += moves[m].summary.bytes_sent();
            char line[256];
            std::snprintf(line, sizeof line,
                          "program on mesh(%s), rank %d: %zu nodes, %zu weights, %zu "
                          "redistributions (%zu forward, %zu backward)\n",
                          view.shape.to_string().c_str(), view.rank, prog.nodes().size(),
                          weights.size(), moves.size(), sched.moves.size() - count_adjoint(),
                          count_adjoint());
            std::string out = line;
            std::snprintf(line, sizeof line,
                          "  parameters %zu bytes, gradients %zu bytes, optimizer state %zu "
                          "bytes per state slot\n  arena (peak activations, cotangents, "
                          "redistributed copies) %zu bytes\n  redistributions send %zu bytes "
                          "forward, %zu backward per step\n",
                          params, params, params, sched.arena_bytes, sent_fwd, sent_bwd);
            out += line;
            std::size_t halos = 0;
            for (const auto& n : sched.nodes)
                halos += n.kernel_bytes;
            if (halos > 0) {
                std::snprintf(line, sizeof line,
                              "  halos (split heights and widths) send %zu bytes per forward pass "
                              "and up to twice that backward\n",
                              halos);
                out += line;
            }
            std::size_t kernels = 0, again = 0, resent = 0;
            for (const auto& st : sched.backward) {
                kernels += st.kind == detail::program_step_kind::kernel ? 1 : 0;
                if (st.kind == detail::program_step_kind::move && !sched.moves[st.move].adjoint) {
                    ++again;
                    resent += moves[st.move].summary.bytes_sent();
                }
            }
            if (kernels + again > 0) {
                std::snprintf(line, sizeof line,
                              "  recomputed in the backward pass: %zu kernels, %zu "
                              "redistributions sending %zu bytes\n",
                              kernels, again, resent);
                out += line;
            }
            return out + describe();
        }

        std::size_t count_adjoint() const {
            std::size_t n = 0;
            for (const auto& m : sched.moves)
                n += m.adjoint ? 1 : 0;
            return n;
        }
    };

    /// Makes the program of input shapes `shapes` the current one (see the class comment):
    /// kept, or traced and compiled now; the weights move to it. Input counts that differ are
    /// left to bind_inputs to report.
    void take_shapes(std::vector<value_shape> shapes) {
        const auto& inputs = s_->prog.inputs();
        if (shapes.size() != inputs.size() || shapes == input_shapes())
            return;
        std::unique_ptr<state> next;
        if (const auto it = others_.find(shapes); it != others_.end()) {
            next = std::move(it->second);
            others_.erase(it);
        } else {
            std::vector<input_spec> specs;
            for (std::size_t i = 0; i < inputs.size(); ++i)
                specs.push_back(
                    {s_->prog.value(inputs[i]).name, shapes[i], s_->prog.value(inputs[i]).type});
            program p = (*retrace_)(specs);
            // The annotations carry over by node name, and so do the custom nodes' operations:
            // their layers' weights stay the same objects, as the program's weights do.
            std::map<std::string, const program_node*> current;
            for (const auto& n : s_->prog.nodes())
                current.emplace(n.name, &n);
            for (const auto& n : p.nodes())
                if (const auto it = current.find(n.name); it != current.end()) {
                    auto& to = p.node(n.name);
                    if (n.annotation.empty())
                        to.annotation = it->second->annotation;
                    if (n.custom && it->second->custom)
                        to.custom = it->second->custom;
                }
            next = std::make_unique<state>(std::move(p), s_->mesh, s_->options);
            next->build(nullptr, false);
            bool alike = next->prog.weights().size() == s_->weights.size();
            for (std::size_t i = 0; alike && i < s_->weights.size(); ++i) {
                const auto& a = s_->sched.slots[s_->sched.weight_slot[i]].shard;
                const auto& b = next->sched.slots[next->sched.weight_slot[i]].shard;
                alike = next->weight_name(i) == s_->weight_name(i) && a.global == b.global &&
                        a.l == b.l;
            }
            if (!alike)
                throw error("xshard: compiled_program: the program traced for input shapes " +
                            shapes_text(shapes) +
                            " has other weights or weight layouts than "
                            "the one for " +
                            shapes_text(input_shapes()));
        }
        next->weights = std::move(s_->weights); // the same objects: a deque moves its blocks
        s_->weights.clear();
        next->profile_steps(s_->profiling);
        auto kept = input_shapes();
        others_.emplace(std::move(kept), std::move(s_));
        s_ = std::move(next);
    }

    /// `p` with each custom node's operation cloned (custom_kernels::clone).
    static program with_cloned_customs(program p) {
        for (const auto& n : p.nodes())
            if (n.custom) {
                const auto* k = dynamic_cast<const custom_kernels<T, Mesh>*>(n.custom.get());
                if (k)
                    p.node(n.name).custom = k->clone(n.name);
            }
        return p;
    }

    static std::string shapes_text(const std::vector<value_shape>& shapes) {
        std::string out;
        for (const auto& s : shapes)
            out += (out.empty() ? "" : ", ") + shape_text(s);
        return out;
    }

    std::unique_ptr<state> s_;
    /// The traced function, for inputs of other shapes (null: one shape), and the programs
    /// compiled for the other shapes seen, without weights.
    std::shared_ptr<const std::function<program(const std::vector<input_spec>&)>> retrace_;
    std::map<std::vector<value_shape>, std::unique_ptr<state>> others_;
};

namespace detail {

/// Whether M is a compiled program.
template <class M>
constexpr bool is_compiled_program = false;
template <class T, class Mesh>
constexpr bool is_compiled_program<compiled_program<T, Mesh>> = true;

} // namespace detail

/// Compiles `p` onto `mesh` for element type T (see compiled_program).
template <class T, mesh_type Mesh>
compiled_program<T, Mesh> compile(program p, const Mesh& mesh, compile_options options = {}) {
    return compiled_program<T, Mesh>(std::move(p), mesh, std::move(options));
}

/// Traces `fn` on `inputs` (graph/trace.hpp) and compiles the program onto `mesh` for element
/// type T, remembering `fn`: forward passes then take inputs of any shape, each new shape
/// traced and compiled once (see compiled_program). `fn` is kept (copied).
template <class T, mesh_type Mesh, class F, class... In>
requires(std::is_same_v<In, input_spec>&&...) compiled_program<T, Mesh> compile(
    F fn, const Mesh& mesh, compile_options options, const In&... inputs) {
    auto retrace = [fn](const std::vector<input_spec>& specs) {
        return [&]<std::size_t... I>(std::index_sequence<I...>) {
            return trace(fn, specs[I]...);
        }
        (std::index_sequence_for<In...>{});
    };
    compiled_program<T, Mesh> out(retrace(std::vector<input_spec>{inputs...}), mesh,
                                  std::move(options));
    out.retrace_with(std::move(retrace));
    return out;
}

} // namespace xshard
