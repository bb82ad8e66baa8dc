#pragma once
/// \file
/// A program as a chain of layers: its modules (graph/split.hpp: one per top-level scope),
/// each compiled onto the mesh as a program of its own, each a layer with `forward(x)` and
/// `backward(dy)` on one tensor type. A pipeline cuts it into stages like any model of layers
/// (pipeline/pipeline.hpp), by the modules' names:
///
///     auto net = [](xshard::traced_tensor x) {
///         for (int i = 0; i < 8; ++i) {
///             xshard::name_scope s("block" + std::to_string(i));
///             x = ...; // the block's operations, its weights declared inside the scope
///         }
///         return x;
///     };
///     xshard::program_chain<double, stage_mesh_t> chain(net, stage_mesh, {.seed = 1}, x_spec);
///     xshard::pipeline::pipeline<decltype(chain), decltype(chain)::tensor_type> pipe(
///         mesh, "pp", stage_mesh, chain, {.micro_batches = 8, .stage_config = {{"block4", 1}}});
///
/// The weights keep the program's names ("block0.fc.weight": module "block0", weight
/// "fc.weight") and values, so checkpoints and strategy files of the whole program and of the
/// chain are alike. Each module's program is a copyable compiled program, so a pipeline runs
/// several micro-batches through it at once, each in a copy with its own arena (and the
/// home's weights lent in). Its layouts are the semi-auto defaults, the program's annotations
/// and the compile options' layouts; each module after the first receives its input in the
/// layout the module before it keeps that tensor in (unless it is a pending sum), so the cut
/// itself moves nothing.

#include <xshard/comm/error.hpp>
#include <xshard/graph/executable.hpp>
#include <xshard/graph/split.hpp>
#include <xshard/graph/trace.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard {

/// One module of a program chain (see the file comment): its compiled program, and the input
/// of its last forward pass, which the backward pass reads.
template <class T, mesh_type Mesh, std::size_t N = 2>
class program_layer {
public:
    using tensor_type = dtensor<T, Mesh, dynamic_layout(N)>;

    /// The layer of module `name` compiled as `net`.
    program_layer(std::string name, compiled_program<T, Mesh> net)
        : name_(std::move(name))
        , net_(std::move(net)) {}

    /// The module's forward pass on `x`; returns its output, its pending sums resolved (the
    /// next module, a pipeline's transfer or the loss reads whole values).
    tensor_type forward(const tensor_type& x) {
        input_.reset();
        input_.emplace(x);
        net_.run(*input_);
        return detail::without_pending_sums(net_.template output<N>(0));
    }

    /// The backward pass of the last forward pass, seeded with `dy`: adds the weights'
    /// gradient terms and returns the input's cotangent (an empty tensor for a module compiled
    /// without input_gradients: the chain's first, unless the chain was asked for it).
    tensor_type backward(const tensor_type& dy) {
        if (!input_)
            throw error("xshard: program_chain: " + name_ + ": backward without a forward pass");
        net_.backward(dy);
        input_.reset();
        if (!net_.options().input_gradients) {
            std::array<std::size_t, N> none{};
            return tensor_type(detail::unchecked, net_.mesh(), none,
                               tensor_type::local_type::from_shape(none), layout::replicated(N));
        }
        return net_.template input_gradient<N>(0);
    }

    /// The module's name and compiled program.
    const std::string& name() const noexcept { return name_; }
    compiled_program<T, Mesh>& program() noexcept { return net_; }
    const compiled_program<T, Mesh>& program() const noexcept { return net_; }

    /// The weights, named within the module ("fc.weight" of "block0.fc.weight").
    friend void visit_parameters(program_layer& l, auto&& visit) {
        visit_parameters(l.net_, [&](const std::string& name, auto& w) {
            visit(name.substr(l.name_.size() + 1), w);
        });
    }

private:
    std::string name_;
    compiled_program<T, Mesh> net_;
    std::optional<tensor_type> input_;
};

/// A program cut into its modules, each compiled onto `mesh` (see the file comment). T is the
/// element type; every tensor between modules, the input and the output have rank N.
template <class T, mesh_type Mesh, std::size_t N = 2>
class program_chain {
public:
    using tensor_type = dtensor<T, Mesh, dynamic_layout(N)>;
    using layer_type = program_layer<T, Mesh, N>;

    /// Cuts `p` into modules (split_modules) and compiles each onto `mesh` with `options`: its
    /// seed; input_gradients for the first module (the others always give theirs); the
    /// dataset axes, the input's layout for the first module, the weight layouts and shard
    /// axes of each module's weights; a recomputed scope or run for the module holding it.
    /// Collective over the mesh; what does not fit raises xshard::error on every rank alike.
    program_chain(const program& p, const Mesh& mesh, const compile_options& options = {})
        : source_(p)
        , options_(options) {
        auto modules = split_modules(p);
        auto per_module = recomputed_per_module(modules, options);
        for (std::size_t m = 0; m < modules.size(); ++m) {
            auto o = module_options(modules, m, std::move(per_module[m]),
                                    m ? &layers_[m - 1].program() : nullptr);
            layers_.emplace_back(
                modules[m].name,
                compiled_program<T, Mesh>(std::move(modules[m].body), mesh, std::move(o)));
        }
    }

    /// Traces `fn` on `input` and cuts and compiles the program as above, keeping `fn`: a
    /// module then runs on a tensor with another number of rows (dimension 0, the batch: a
    /// last batch, or a pipeline's uneven micro-batches) by tracing `fn` again for that many
    /// rows and compiling its piece, once per shape (compiled_program's retracing). `fn` is
    /// kept (copied).
    template <class F>
        requires std::is_invocable_v<const F&, traced_tensor>
    program_chain(F fn, const Mesh& mesh, const compile_options& options, input_spec input)
        : program_chain(trace(fn, input), mesh, options) {
        const auto modules_for = [fn, input](std::size_t rows) {
            auto in = input;
            in.shape[0] = rows;
            return split_modules(trace(fn, in));
        };
        for (std::size_t i = 0; i < layers_.size(); ++i)
            layers_[i].program().retrace_with(
                [modules_for, i, name = layers_[i].name()](const std::vector<input_spec>& specs) {
                    const auto rows = specs.at(0).shape.empty() ? 0 : specs[0].shape[0];
                    auto modules = modules_for(rows);
                    if (i >= modules.size() || modules[i].name != name)
                        throw error("xshard: program_chain: traced for " + std::to_string(rows) +
                                    " rows, the program has other modules than " + name);
                    return std::move(modules[i].body);
                });
    }

    /// The forward pass of every module in turn.
    tensor_type forward(const tensor_type& x) {
        tensor_type h = x;
        for (auto& l : layers_)
            h = l.forward(h);
        return h;
    }

    /// The backward pass of every module in reverse; returns the input's cotangent (empty
    /// unless compiled with input_gradients).
    tensor_type backward(const tensor_type& dy) {
        tensor_type g = dy;
        for (auto it = layers_.rbegin(); it != layers_.rend(); ++it)
            g = it->backward(g);
        return g;
    }

    /// Cuts `p` (this chain's program, or it annotated: program_strategy::apply) into the same
    /// modules and compiles each again with `options` (compiled_program::recompile: the weights
    /// keep their values, redistributed where their layouts change). What the search on
    /// programs and the training driver call. Collective over the mesh; a program cut into
    /// other modules raises.
    void recompile(const program& p, const compile_options& options) {
        auto modules = split_modules(p);
        bool same = modules.size() == layers_.size();
        for (std::size_t m = 0; same && m < modules.size(); ++m)
            same = modules[m].name == layers_[m].name();
        if (!same)
            throw error("xshard: program_chain: recompile: the program's modules are not the "
                        "chain's");
        const auto keep = options_;
        options_ = options;
        try {
            // Every module compiled first, so that one that does not fit changes nothing.
            const auto per_module = recomputed_per_module(modules, options);
            std::vector<compiled_program<T, Mesh>> trial;
            trial.reserve(modules.size());
            for (std::size_t m = 0; m < modules.size(); ++m)
                trial.emplace_back(
                    modules[m].body, mesh(),
                    module_options(modules, m, per_module[m], m ? &trial[m - 1] : nullptr));
            for (std::size_t m = 0; m < modules.size(); ++m)
                layers_[m].program().replace(std::move(trial[m]));
        } catch (...) {
            options_ = keep;
            throw;
        }
        source_ = p;
    }

    /// The whole program (as traced, or as last recompiled), the options, and the mesh.
    const program& source() const noexcept { return source_; }
    const compile_options& options() const noexcept { return options_; }
    const Mesh& mesh() const { return layers_.front().program().mesh(); }

    /// The modules, in order.
    std::vector<layer_type>& layers() noexcept { return layers_; }
    const std::vector<layer_type>& layers() const noexcept { return layers_; }

    /// The modules by name, in order (parameter traversal: "block0.fc.weight").
    friend void visit_parameters(program_chain& c, auto&& visit) {
        for (auto& l : c.layers_)
            visit(l.name(), l);
    }

private:
    /// The recomputed scopes and runs of `options`, per module.
    static std::vector<std::vector<std::string>>
    recomputed_per_module(const std::vector<program_module>& modules,
                          const compile_options& options) {
        std::vector<std::vector<std::string>> out(modules.size());
        for (const auto& entry : options.recompute)
            out[module_of(modules, entry)].push_back(entry);
        return out;
    }

    /// The options of module `m` (see the constructor), `before` the module before it
    /// compiled: its input in the layout that one keeps it in, unless a pending sum.
    compile_options module_options(const std::vector<program_module>& modules, std::size_t m,
                                   std::vector<std::string> recompute,
                                   const compiled_program<T, Mesh>* before) const {
        const auto& body = modules[m].body;
        check_rank(modules[m].name, body, body.inputs()[0], "input");
        check_rank(modules[m].name, body, body.outputs()[0], "output");
        compile_options o;
        o.seed = options_.seed;
        o.input_gradients = m > 0 || options_.input_gradients;
        o.layouts.dataset_axes = options_.layouts.dataset_axes;
        o.layouts.weight_shard_axes = options_.layouts.weight_shard_axes;
        o.layouts.weight_shard_min_bytes = options_.layouts.weight_shard_min_bytes;
        const auto& input = body.value(body.inputs()[0]).name;
        if (!before) {
            o.layouts.input_layouts = options_.layouts.input_layouts;
        } else {
            const auto& kept = before->layouts().values[before->source().outputs()[0]];
            if (kept.partial.empty())
                o.layouts.input_layouts[input] = kept;
        }
        for (auto id : body.weights())
            if (const auto it = options_.layouts.weight_layouts.find(body.value(id).name);
                it != options_.layouts.weight_layouts.end())
                o.layouts.weight_layouts.insert(*it);
        o.recompute = std::move(recompute);
        return o;
    }

    /// The module a recomputed scope or run "a..b" lies in; raises when it names none, or
    /// when a run spans modules.
    static std::size_t module_of(const std::vector<program_module>& modules,
                                 const std::string& entry) {
        const auto dots = entry.find("..");
        const auto first = detail::top_scope(entry.substr(0, dots));
        const auto last =
            dots == std::string::npos ? first : detail::top_scope(entry.substr(dots + 2));
        for (std::size_t m = 0; m < modules.size(); ++m)
            if (modules[m].name == first) {
                if (last != first)
                    throw error("xshard: program_chain: the recomputed run " + entry +
                                " spans the modules " + first + " and " + last +
                                "; a run lies inside one module");
                return m;
            }
        throw error("xshard: program_chain: the recomputed scope " + entry +
                    " lies in no module of the program");
    }

    static void check_rank(const std::string& module, const program& body, std::size_t id,
                           const char* what) {
        const auto& v = body.value(id);
        if (v.shape.size() != N || v.type != dtype_for<T>())
            throw error("xshard: program_chain: the " + std::string(what) + " of " + module +
                        " is " + std::string(to_string(v.type)) + shape_text(v.shape) +
                        ", but the chain's tensors are " + std::string(to_string(dtype_for<T>())) +
                        " of rank " + std::to_string(N));
    }

    program source_;
    compile_options options_;
    std::vector<layer_type> layers_;
};

namespace detail {

/// Whether M is a program chain.
template <class M>
constexpr bool is_program_chain = false;
template <class T, class Mesh, std::size_t N>
constexpr bool is_program_chain<program_chain<T, Mesh, N>> = true;

} // namespace detail

} // namespace xshard
