#pragma once
/// \file
/// The cost model of the strategy search (MindSpore's auto-parallel cost model): what one
/// operator of a sequential network costs one rank under a candidate strategy, on a mesh of
/// any size, computed in one process without MPI.
///
/// The network is a chain of operators on activations [tokens, features] (`network_spec`:
/// linear, elementwise, row normalisation, attention core, embedding). A stage of the
/// pipeline runs its operators on a mesh (dp, tp); between operators an activation is in one
/// of three layouts (`activation_split`):
///
///     rows      [dp, -]        rows over dp, features whole (replicated over tp)
///     features  [dp, tp]       rows over dp, features over tp
///     all_rows  [(dp, tp), -]  rows over every rank of the stage
///
/// An operator's strategy (`op_choice`) names the layout it takes, its weight's layout and
/// the layout its output is redistributed to (MindSpore's in_strategy / out_strategy). Its
/// costs per micro-batch and rank (`op_cost`):
///  * compute: forward and backward FLOPs (3x the forward GEMMs) at `machine_model::
///    gemm_flops`, elementwise work at `memory_bandwidth`;
///  * communication: the output's redistribution and its adjoint (the dual layouts, as
///    nn::kept_redistribution runs them), each priced by the redistribution planner's
///    candidates under the alpha-beta `cost_model` (per kind, or per mesh axis); per step the
///    weight's gradient synchronisation at the hsdp level (train/hsdp.hpp: level 0 an
///    all-reduce, level 1 all-reduce then all-gather, level 2 reduce-scatter then all-gather)
///    and its optimizer update and zero_grad (memory-bound, on the shard under hsdp);
///  * memory: weights, gradients (sharded at level 2), optimizer state (sharded at levels 1
///    and 2), and the activations kept for the backward pass per micro-batch in flight.
///
/// Redistribution prices are the planner's (`redistribution_pricer`): redistribution_plan runs
/// the cheapest of its candidates and of the routes through intermediate layouts
/// (redistribute/route.hpp), a shortest path, so a direct redistribution never costs more
/// than a detour (tests/redistribute/test_planner.cpp checks it on random layout triples)
/// and the price is what a run does; `route` names the layouts it passes through.

#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/core/sharded_layout.hpp>
#include <xshard/redistribute/cost_model.hpp>
#include <xshard/redistribute/geometry.hpp>
#include <xshard/redistribute/planner.hpp>
#include <xshard/redistribute/route.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <initializer_list>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace xshard {

/// What the search prices with: the alpha-beta links of the redistribution planner
/// (`cost_model`, per kind or per mesh axis), the GEMM speed and memory bandwidth of one rank,
/// the element size, the optimizer's state per weight element and the hsdp threshold.
struct machine_model {
    cost_model links{};
    /// FLOP/s of one rank's GEMM (bench_search measures it: OpenBLAS, one core).
    double gemm_flops = 3.0e10;
    /// Bytes/s of one rank's elementwise work (read and write).
    double memory_bandwidth = 5.4e9;
    /// Bytes per element of weights and activations.
    std::size_t element = 4;
    /// Optimizer state, in weight-sized tensors (Adam: 2).
    double optimizer_states = 2;
    /// hsdp's threshold: weights below it (global bytes) stay unsharded (64 KB).
    std::size_t hsdp_threshold_bytes = 64 * 1024;
};

/// The kinds of operator the search knows.
enum class op_kind { linear, elementwise, normalization, attention, embedding };

constexpr std::string_view to_string(op_kind k) {
    switch (k) {
    case op_kind::linear:
        return "linear";
    case op_kind::elementwise:
        return "elementwise";
    case op_kind::normalization:
        return "normalization";
    case op_kind::attention:
        return "attention";
    case op_kind::embedding:
        return "embedding";
    }
    return "?";
}

/// One operator of the chain: `in` and `out` features (a linear's weight is [in, out], an
/// embedding's [in = vocabulary, out]), a bias, attention's heads.
struct op_spec {
    std::string name;
    op_kind kind = op_kind::linear;
    std::size_t in = 0, out = 0;
    bool bias = true;
    std::size_t heads = 1;
};

/// A sequential network: the chain of operators, the samples per step (`batch`) and the
/// tokens per sample (`seq`, 1 for an MLP).
struct network_spec {
    std::string description;
    std::vector<op_spec> ops;
    std::size_t batch = 1;
    std::size_t seq = 1;
};

/// An MLP of the given widths, e.g. {784, 512, 512, 10}: linear, relu, ..., linear.
inline network_spec mlp_network(const std::vector<std::size_t>& widths, std::size_t batch) {
    if (widths.size() < 2)
        throw std::invalid_argument("xshard: an mlp needs at least two widths (in and out)");
    network_spec n;
    n.batch = batch;
    n.description = "mlp:";
    for (std::size_t i = 0; i < widths.size(); ++i) {
        if (widths[i] == 0)
            throw std::invalid_argument("xshard: an mlp's widths must be positive");
        n.description += (i ? "," : "") + std::to_string(widths[i]);
    }
    for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
        if (i > 0)
            n.ops.push_back(
                {"relu" + std::to_string(i), op_kind::elementwise, widths[i], widths[i], false, 1});
        n.ops.push_back(
            {"linear" + std::to_string(i + 1), op_kind::linear, widths[i], widths[i + 1], true, 1});
    }
    return n;
}

/// A GPT-style decoder: embedding, `layers` blocks (norm, qkv, attention, projection, norm,
/// up, gelu, down; residual additions are not priced), a final norm and the vocabulary head.
inline network_spec transformer_network(std::size_t layers, std::size_t hidden, std::size_t heads,
                                        std::size_t seq, std::size_t vocab, std::size_t batch) {
    if (layers == 0 || hidden == 0 || heads == 0 || seq == 0 || vocab == 0)
        throw std::invalid_argument("xshard: a transformer's sizes must be positive");
    if (hidden % heads != 0)
        throw std::invalid_argument("xshard: a transformer's heads (" + std::to_string(heads) +
                                    ") must divide its hidden size (" + std::to_string(hidden) +
                                    ")");
    network_spec n;
    n.batch = batch;
    n.seq = seq;
    n.description = "transformer:" + std::to_string(layers) + "," + std::to_string(hidden) + "," +
                    std::to_string(heads) + "," + std::to_string(seq) + "," + std::to_string(vocab);
    n.ops.push_back({"embedding", op_kind::embedding, vocab, hidden, false, 1});
    for (std::size_t l = 0; l < layers; ++l) {
        const std::string b = "block" + std::to_string(l) + ".";
        n.ops.push_back({b + "norm1", op_kind::normalization, hidden, hidden, true, 1});
        n.ops.push_back({b + "qkv", op_kind::linear, hidden, 3 * hidden, true, 1});
        n.ops.push_back({b + "attention", op_kind::attention, 3 * hidden, hidden, false, heads});
        n.ops.push_back({b + "proj", op_kind::linear, hidden, hidden, true, 1});
        n.ops.push_back({b + "norm2", op_kind::normalization, hidden, hidden, true, 1});
        n.ops.push_back({b + "up", op_kind::linear, hidden, 4 * hidden, true, 1});
        n.ops.push_back({b + "gelu", op_kind::elementwise, 4 * hidden, 4 * hidden, false, 1});
        n.ops.push_back({b + "down", op_kind::linear, 4 * hidden, hidden, true, 1});
    }
    n.ops.push_back({"norm", op_kind::normalization, hidden, hidden, true, 1});
    n.ops.push_back({"head", op_kind::linear, hidden, vocab, false, 1});
    return n;
}

/// The layout of an activation between operators (see the file comment).
enum class activation_split : std::uint8_t { rows, features, all_rows };
inline constexpr std::array<activation_split, 3> activation_splits = {
    activation_split::rows, activation_split::features, activation_split::all_rows};

constexpr std::string_view to_string(activation_split a) {
    switch (a) {
    case activation_split::rows:
        return "[dp, -]";
    case activation_split::features:
        return "[dp, tp]";
    case activation_split::all_rows:
        return "[(dp, tp), -]";
    }
    return "?";
}

/// The activation split written as `text` (as `to_string`), if it is one.
inline std::optional<activation_split> parse_activation_split(std::string_view text) {
    const auto l = layout::parse(text);
    for (auto a : activation_splits)
        if (layout::parse(to_string(a)) == l)
            return a;
    return std::nullopt;
}

/// How an operator splits its weight: not at all, by output features (MindSpore's
/// ((dp, 1), (1, tp)), Megatron's column parallel), by input features (((dp, tp), (tp, 1)),
/// row parallel).
enum class weight_split : std::uint8_t { replicated, output, input };

constexpr std::string_view to_string(weight_split w) {
    switch (w) {
    case weight_split::replicated:
        return "replicated";
    case weight_split::output:
        return "output";
    case weight_split::input:
        return "input";
    }
    return "?";
}

inline std::optional<weight_split> parse_weight_split(std::string_view text) {
    for (auto w : {weight_split::replicated, weight_split::output, weight_split::input})
        if (text == to_string(w))
            return w;
    return std::nullopt;
}

/// An operator's strategy: the split it takes, how its weight is split, and the split its
/// output is redistributed to.
struct op_choice {
    activation_split in = activation_split::rows;
    weight_split weight = weight_split::replicated;
    activation_split out = activation_split::rows;
    friend constexpr bool operator==(const op_choice&, const op_choice&) = default;
};

/// The parallel degrees of a candidate: data, tensor and pipeline parallel ranks
/// (dp x tp x pp = the world), micro-batches per step, and the hsdp level (0: none).
struct parallel_degrees {
    int dp = 1, tp = 1, pp = 1;
    int micro_batches = 1;
    int hsdp_level = 0;
    friend constexpr bool operator==(const parallel_degrees&, const parallel_degrees&) = default;
};

/// The layout of a split on a stage's (dp, tp) mesh.
inline layout activation_layout(activation_split a) {
    return layout::parse(to_string(a));
}

/// The weight's layout [in, out] under `w` (an embedding's too), and its bias' [out].
inline layout weight_layout(weight_split w) {
    switch (w) {
    case weight_split::output:
        return layout::parse("[-, tp]");
    case weight_split::input:
        return layout::parse("[tp, -]");
    default:
        return layout::parse("[-, -]");
    }
}
inline layout bias_layout(weight_split w) {
    return layout::parse(w == weight_split::output ? "[tp]" : "[-]");
}

/// The (weight split, output layout before redistribution) pairs operator `op` can run with on
/// input split `in`, on a (dp, tp) mesh with `samples` samples per micro-batch. Empty when `in`
/// does not suit the operator (a normalisation needs whole rows; attention whole heads and
/// whole sequences).
inline std::vector<std::pair<weight_split, layout>>
op_options(const op_spec& op, activation_split in, int dp, int tp, std::size_t samples) {
    using enum activation_split;
    std::vector<std::pair<weight_split, layout>> r;
    const auto keep = [&] {
        r.push_back({weight_split::replicated, activation_layout(in)});
    };
    switch (op.kind) {
    case op_kind::linear:
        if (in == rows) {
            r.push_back({weight_split::output, layout::parse("[dp, tp]")});
            r.push_back({weight_split::replicated, layout::parse("[dp, -]")});
        } else if (in == features) {
            r.push_back({weight_split::input, layout::parse("[dp, -] partial(sum: tp)")});
        } else {
            keep();
        }
        break;
    case op_kind::embedding: // the input is token ids: rows, whatever their features
        if (in == all_rows)
            keep();
        else {
            r.push_back({weight_split::replicated, layout::parse("[dp, -]")});
            r.push_back({weight_split::output, layout::parse("[dp, tp]")});
            r.push_back({weight_split::input, layout::parse("[dp, -] partial(sum: tp)")});
        }
        break;
    case op_kind::elementwise:
        keep();
        break;
    case op_kind::normalization:
        if (in != features)
            keep();
        break;
    case op_kind::attention:
        if (in == rows || (in == features && op.heads % std::size_t(tp) == 0) ||
            (in == all_rows && samples % std::size_t(dp * tp) == 0))
            keep();
        break;
    }
    return r;
}

/// The price of one redistribution for the slowest rank: seconds and bytes sent.
struct redistribution_price {
    double seconds = 0;
    std::size_t bytes = 0;
};

/// Prices redistributions of [rows, features] activations on one (dp, tp) mesh with the
/// planner's candidates and the alpha-beta model, memoised, closed under composition through
/// the search's activation layouts and their duals (see the file comment). No MPI.
class redistribution_pricer {
public:
    redistribution_pricer(const mesh_shape& mesh, const cost_model& model, std::size_t element)
        : mesh_(mesh)
        , model_(model)
        , element_(element)
        , ranks_(sample_ranks()) {}

    /// The planner's price of `from` -> `to` (redistribution_plan's choice, route.hpp: the
    /// cheapest of its candidates and of the routes through intermediate layouts), for the
    /// slowest of `sample_ranks` per step.
    template <std::size_t N>
    redistribution_price direct(const layout& from, const layout& to,
                                const std::array<std::size_t, N>& shape) const {
        return price_of(planned(from, to, shape), shape);
    }

    /// The steps of the planner's route `from` -> `to`.
    template <std::size_t N>
    step_list planned(const layout& from, const layout& to,
                      const std::array<std::size_t, N>& shape) const {
        if (from == to)
            return {};
        return choose_route(plan_redistribution(from, to), mesh_, shape, element_, model_, {},
                            ranks_)
            .steps;
    }

    /// `direct`, memoised per layouts and shape.
    template <std::size_t N>
    redistribution_price direct_memo(const layout& from, const layout& to,
                                     const std::array<std::size_t, N>& shape) {
        auto key = std::make_tuple(from.to_string(), to.to_string(),
                                   std::vector<std::size_t>(shape.begin(), shape.end()));
        if (auto it = memo_.find(key); it != memo_.end())
            return it->second;
        return memo_.emplace(std::move(key), direct(from, to, shape)).first->second;
    }

    /// The price of `from` -> `to` for a [rows, features] tensor: the planner's (`direct`),
    /// memoised. A distance: price(a, c) <= price(a, b) + price(b, c) (route.hpp).
    redistribution_price operator()(const layout& from, const layout& to, std::size_t rows,
                                    std::size_t features) {
        if (from == to)
            return {};
        return direct_memo(from, to, std::array<std::size_t, 2>{rows, features});
    }

    /// The layouts the planner's route `from` -> `to` passes through, both ends included.
    std::vector<layout> route(const layout& from, const layout& to, std::size_t rows,
                              std::size_t features) const {
        std::vector<layout> r{from};
        for (const auto& s : planned(from, to, std::array<std::size_t, 2>{rows, features}))
            r.push_back(s.to);
        return r;
    }

    const mesh_shape& mesh() const noexcept { return mesh_; }
    const cost_model& model() const noexcept { return model_; }

    /// The ranks priced: every rank of a mesh of at most 64, else its corner ranks (those
    /// whose coordinates are 0, 1, the middle or the last on every axis).
    std::vector<int> sample_ranks() const {
        if (mesh_.size() > 64)
            return detail::corner_ranks(mesh_);
        std::vector<int> ranks;
        for (int r = 0; r < mesh_.size(); ++r)
            ranks.push_back(r);
        return ranks;
    }

private:
    mesh_shape mesh_;
    cost_model model_;
    std::size_t element_;
    std::vector<int> ranks_;
    template <std::size_t N>
    redistribution_price price_of(const step_list& steps,
                                  const std::array<std::size_t, N>& shape) const {
        redistribution_price p;
        for (const auto& s : steps) {
            p.seconds += price_step(s, mesh_, shape, element_, ranks_, model_).first;
            std::size_t sent = 0;
            for (int r : ranks_) {
                step_list one;
                one.push_back(s);
                sent =
                    std::max(sent, summarize(one, mesh_, shape, element_, r, model_).bytes_sent());
            }
            p.bytes += sent;
        }
        return p;
    }

    std::map<std::tuple<std::string, std::string, std::vector<std::size_t>>, redistribution_price>
        memo_;
};

/// What one operator costs one rank of its stage (see the file comment). Times are seconds,
/// memory bytes.
struct op_cost {
    double compute = 0;            ///< per micro-batch, forward and backward
    double communication = 0;      ///< per micro-batch, the output's redistribution and its adjoint
    double synchronization = 0;    ///< per step, the weight's gradient synchronisation and update
    std::size_t comm_bytes = 0;    ///< per micro-batch, bytes sent (the redistributions)
    std::size_t sync_bytes = 0;    ///< per step, bytes sent (the gradient synchronisation)
    std::size_t weight_memory = 0; ///< weights, gradients, optimizer state
    std::size_t activation_memory = 0; ///< kept for the backward pass, per micro-batch
    bool valid = false;
};

namespace detail {

/// The largest block of `n` split `k` ways.
constexpr std::size_t largest_block(std::size_t n, std::size_t k) {
    return (n + k - 1) / k;
}

/// A weight's layout with its replicated axes of size > 1 (its data-parallel group) added to
/// one dimension, as train/hsdp.hpp shards it (core/sharded_layout.hpp); nullopt when it has
/// none.
inline std::optional<layout> sharded_layout(const layout& w, const mesh_shape& mesh,
                                            const std::vector<std::size_t>& shape) {
    axis_set extra;
    for (std::size_t i = 0; i < mesh.names.size(); ++i)
        if (mesh.sizes[i] > 1 && !w.uses(mesh.names[i]))
            extra = extra.with(i);
    if (extra.empty())
        return std::nullopt;
    return xshard::sharded_layout(w, mesh, shape, extra);
}

} // namespace detail

/// The cost of operator `op` with strategy `c` on a stage's (dp, tp) mesh (`pricer`'s), with
/// `samples` samples of `seq` tokens per micro-batch and the hsdp level `hsdp_level`.
inline op_cost cost_of(const op_spec& op, const op_choice& c, std::size_t samples, std::size_t seq,
                       int hsdp_level, const machine_model& m, redistribution_pricer& pricer) {
    op_cost r;
    const auto& mesh = pricer.mesh();
    const int dp = mesh.sizes[0], tp = mesh.sizes[1];
    const auto options = op_options(op, c.in, dp, tp, samples);
    const auto chosen = std::find_if(options.begin(), options.end(),
                                     [&](const auto& o) { return o.first == c.weight; });
    if (chosen == options.end())
        return r;
    r.valid = true;
    const std::size_t tokens = samples * seq;
    const auto local = [&](const layout& l, std::size_t features) {
        const std::array<std::size_t, 2> shape{tokens, features};
        // The largest block over the ranks: blocks on a dimension differ by one at most.
        return std::array<std::size_t, 2>{
            detail::largest_block(shape[0], std::size_t(l.split_count(0, mesh))),
            detail::largest_block(shape[1], std::size_t(l.split_count(1, mesh)))};
    };
    const auto in_layout = activation_layout(c.in);
    const auto out_layout = chosen->second;
    const auto x = local(in_layout, op.kind == op_kind::embedding ? 1 : op.in);
    const auto y = local(out_layout, op.out);
    const double e = double(m.element);

    // Compute: a GEMM's forward 2 r k n, its backward twice that.
    switch (op.kind) {
    case op_kind::linear: {
        const double k = c.weight == weight_split::input
                             ? double(detail::largest_block(op.in, std::size_t(tp)))
                             : double(op.in);
        r.compute = 3 * 2 * double(y[0]) * k * double(y[1]) / m.gemm_flops;
        r.activation_memory = std::size_t(x[0] * x[1] * m.element);
        break;
    }
    case op_kind::attention: {
        // Scores q k^T and their use on v: 4 s^2 d per sample and head group, kept: q, k, v
        // and the scores.
        const double rows = double(y[0]), width = double(y[1]);
        r.compute = 3 * 4 * rows * double(seq) * width / m.gemm_flops;
        const double heads = double(op.heads) * width / double(op.out);
        r.activation_memory = std::size_t(double(x[0] * x[1]) * e + rows * double(seq) * heads * e);
        break;
    }
    default: {
        // Elementwise work: read and write the block, forward and backward.
        const double bytes = double(y[0] * y[1]) * e;
        r.compute = 3 * 2 * bytes / m.memory_bandwidth;
        r.activation_memory =
            op.kind == op_kind::embedding ? 0 : std::size_t(x[0] * x[1]) * m.element;
        break;
    }
    }

    // The output's redistribution and its adjoint (dual layouts, as kept_redistribution).
    const auto to = activation_layout(c.out);
    const auto fwd = pricer(out_layout, to, tokens, op.out);
    const auto bwd = pricer(dual(to, mesh), dual(out_layout, mesh), tokens, op.out);
    r.communication = fwd.seconds + bwd.seconds;
    r.comm_bytes = fwd.bytes + bwd.bytes;

    // The weight and bias: memory and gradient synchronisation.
    if (op.kind == op_kind::linear || op.kind == op_kind::embedding ||
        op.kind == op_kind::normalization) {
        std::vector<std::pair<layout, std::vector<std::size_t>>> params;
        if (op.kind == op_kind::normalization) {
            params.push_back({layout::parse("[-]"), {op.out}});
            params.push_back({layout::parse("[-]"), {op.out}});
        } else {
            params.push_back({weight_layout(c.weight), {op.in, op.out}});
            if (op.bias)
                params.push_back({bias_layout(c.weight), {op.out}});
        }
        const double states = m.optimizer_states;
        for (const auto& [wl, shape] : params) {
            std::size_t local_elements = 1, global = m.element;
            for (std::size_t d = 0; d < shape.size(); ++d) {
                local_elements *=
                    detail::largest_block(shape[d], std::size_t(wl.split_count(d, mesh)));
                global *= shape[d];
            }
            const double bytes = double(local_elements) * e;
            std::optional<layout> sharded;
            if (hsdp_level > 0 && global >= m.hsdp_threshold_bytes)
                sharded = detail::sharded_layout(wl, mesh, shape);
            double shard_bytes = bytes;
            if (sharded) {
                std::size_t s = 1;
                for (std::size_t d = 0; d < shape.size(); ++d)
                    s *=
                        detail::largest_block(shape[d], std::size_t(sharded->split_count(d, mesh)));
                shard_bytes = double(s) * e;
            }
            // weight + gradient + optimizer state (+ the sharded master copy's update)
            const double grad = (sharded && hsdp_level >= 2) ? shard_bytes : bytes;
            const double state = states * (sharded ? shard_bytes : bytes);
            r.weight_memory += std::size_t(bytes + grad + state);
            // Gradient synchronisation, priced by the planner on the weight's shape.
            const auto price = [&](const layout& a, const layout& b) {
                if (a == b)
                    return redistribution_price{};
                if (shape.size() == 1)
                    return pricer.direct_memo(a, b, std::array<std::size_t, 1>{shape[0]});
                return pricer.direct_memo(a, b, std::array<std::size_t, 2>{shape[0], shape[1]});
            };
            const auto terms = dual(wl, mesh);
            redistribution_price sync;
            if (!sharded) {
                sync = price(terms, wl);
            } else if (hsdp_level == 1) {
                const auto a = price(terms, wl), b = price(*sharded, wl);
                sync = {a.seconds + b.seconds, a.bytes + b.bytes};
            } else {
                const auto a = price(terms, *sharded), b = price(*sharded, wl);
                sync = {a.seconds + b.seconds, a.bytes + b.bytes};
            }
            // The update reads and writes the (sharded) weight and each state slot and reads
            // the gradient; zero_grad writes the gradient: memory-bound work per step.
            r.synchronization +=
                sync.seconds + ((2 + 2 * states) * (sharded ? shard_bytes : bytes) + 2 * grad) /
                                   m.memory_bandwidth;
            r.sync_bytes += sync.bytes;
        }
    }
    return r;
}

} // namespace xshard
