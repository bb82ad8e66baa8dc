#pragma once
/// \file
/// The strategy search on programs: MindSpore's `sharding_propagation` and
/// `recursive_programming` modes for any traced network (graph/trace.hpp), in one process,
/// without MPI, for a mesh of any axes and size (a dry run).
///
/// Every node of the program is a variable whose values are the ways it can run: the layouts of its
/// operands that its primitive's sharding rule accepts (each mesh axis on at most one dimension of
/// an operand), with the operands' and results' layouts the rule gives. A way costs its compute,
/// forward and backward (the primitive's FLOPs at the GEMM speed, forward and twice again backward
/// when every operand takes a cotangent, in proportion to those that do otherwise; the bytes it
/// streams, `op_rules::passes` times, and its kernels' own (`op_rules::scratch_traffic`: im2col's
/// columns) at the memory bandwidth, and the messages its kernels send themselves,
/// `op_rules::kernel_seconds`: a window's halos over a split height or width, batch norm's
/// all-reduces), times the machine's factor for its primitive (`machine_model::op_scale`), and the
/// gradient synchronisation and update of the weights it is the first to read (the update and the
/// gradients' zeroing at the memory bandwidth). Each edge of the graph (a value from the node that
/// writes it to a node that reads it) costs the redistribution of the value forward and of its
/// cotangent backward, priced by the redistribution planner's own route
/// (search/redistribution_pricer.hpp). The step's predicted time is the sum.
///
/// The minimum over every combination is found exactly: nodes are eliminated one by one as
/// MindSpore's recursive programming does (a node with one neighbour folds into it, a node
/// with two into an edge between them, parallel edges add up), and where no node has fewer
/// than three neighbours the search branches on one node's ways. Chains, branches, residual
/// joins and shared weights eliminate without branching.
///
/// Repeated blocks are searched once: runs of consecutive identical blocks of nodes (the
/// layers of a transformer or a ResNet stage: the same primitives, attributes, shapes, and
/// operands from the same relative places) are laid out alike. Each node's ways are those of
/// its counterpart in the run's first block, and the search minimises over one variable per
/// counterpart class, its costs summed over the blocks (so an exact minimum is the minimum
/// over strategies that lay the blocks out alike).
///
/// A cap on the bytes per rank (`memory_per_rank`: weights with their gradients and optimizer
/// state, and the activations) is a constraint the ways' bytes add up to. Where the fastest
/// strategy exceeds it, Lagrangian relaxation prices each byte and bisects the price, and the
/// strategy found carries a lower bound no strategy within the cap beats.
///
///     auto found = xshard::search_program(traced, mesh.shape());   // recursive_programming
///     found.apply(traced);            // every node annotated with the layouts found
///     auto net = xshard::compile<double>(traced, mesh);
///
/// With `keep_annotations` (sharding propagation) the nodes annotated with `.shard()`, by
/// name, or from a strategy file keep their layouts, and the search fills in the rest.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/graph/layouts.hpp>
#include <xshard/graph/primitive.hpp>
#include <xshard/graph/program.hpp>
#include <xshard/graph/registry.hpp>
#include <xshard/graph/schedule.hpp>
#include <xshard/search/machine_model.hpp>
#include <xshard/search/redistribution_pricer.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace xshard {

/// What the program search prices with and what it keeps.
struct program_search_options {
    /// The machine's links, GEMM speed and memory bandwidth (search/calibrate.hpp measures
    /// them).
    machine_model machine = {};
    /// Where the inputs are: the dataset's axes or each input's layout, as compile takes them.
    layout_options layouts = {};
    /// Sharding propagation: annotated nodes keep their layouts and the search fills in the
    /// others. Without it (recursive programming) annotations are ignored and every node is
    /// searched.
    bool keep_annotations = true;
    /// The most ways kept per node: the cheapest by their own compute when a node has more.
    /// The search is exact over the ways kept.
    std::size_t max_ways = 256;
    /// Whether the program's inputs get gradients (as compile_options::input_gradients).
    bool input_gradients = false;
    /// Bytes a rank may hold: its weights with their gradients and optimizer state, and
    /// every node's results (kept for the backward pass). The search keeps within it, and
    /// raises when no strategy fits.
    double memory_per_rank = std::numeric_limits<double>::infinity();
    /// Repeated blocks searched once: runs of consecutive identical blocks of nodes (24
    /// transformer layers) are laid out alike, each node as its counterpart in the run's
    /// first block, and the search chooses for one block (see the file comment).
    bool share_repeated_blocks = true;
};

/// A run of identical blocks of consecutive nodes: `count` blocks of `nodes` nodes each, from
/// the node at `first` (in the program's order).
struct repeated_block {
    std::size_t first = 0, nodes = 0, count = 0;
    std::string first_name; ///< the first block's first node
};

/// One node's part of a searched strategy.
struct node_strategy {
    std::string node; ///< the node's name
    std::string op;   ///< its primitive
    /// The layouts it reads its operands in (what `apply` annotates) and writes its results in.
    layout_choice layouts;
    /// The layouts its results are kept in where an annotation asks for others (kept with
    /// sharding propagation), else empty.
    std::vector<layout> out_layouts;
    bool annotated = false; ///< kept from an annotation (sharding propagation)
    std::size_t ways = 0;   ///< how many ways the node could run
    /// Seconds per step: its compute (forward and backward, with the messages its kernels
    /// send themselves, such as halos), the redistributions into it
    /// (forward, and their cotangents backward), and its weights' gradient synchronisation
    /// and update (with the gradients' zeroing, `machine_model::update_seconds`).
    double compute = 0, communication = 0, gradient_sync = 0;
    /// The best other way with every other node as chosen (within the memory cap), and the
    /// seconds it loses by (none when the node has no other such way).
    std::optional<layout_choice> runner_up;
    double runner_up_loss = 0;
};

/// A strategy for every node of a program on a mesh, as the search found it.
struct program_strategy {
    mesh_shape mesh;
    std::vector<node_strategy> nodes;
    /// The predicted step: the sum of every node's and edge's seconds.
    double seconds = 0;
    /// Per rank: the weights' bytes, with their gradients and optimizer state.
    std::size_t weight_bytes = 0;
    /// Per rank: every node's results' bytes (kept for the backward pass).
    std::size_t activation_bytes = 0;
    /// The cap searched within (program_search_options::memory_per_rank).
    double memory_cap = std::numeric_limits<double>::infinity();
    /// No strategy within the cap has a faster predicted step. It equals `seconds` when the
    /// search is exact, as it is whenever the cap does not bind.
    double lower_bound = 0;
    /// How many nodes the search branched on (0 for series-parallel graphs).
    std::size_t branched = 0;
    /// The runs of repeated blocks laid out alike (program_search_options::
    /// share_repeated_blocks).
    std::vector<repeated_block> repeated;

    /// The predicted bytes per rank: weights, gradients, optimizer state and activations.
    std::size_t memory_bytes() const noexcept { return weight_bytes + activation_bytes; }

    /// Annotates every node of `p` with the layouts found (`in_layouts`, and `out_layouts`
    /// where kept); compile then runs them. Throws xshard::error when `p` lacks one of the nodes.
    void apply(program& p) const;

    /// Every node's choice, what it costs and the runner-up, then the step's predicted time
    /// and the weights' memory per rank: why the search chose what it chose.
    std::string explain() const;

    /// The nodes whose layouts differ between this strategy and `other`, one line each
    /// ("name: this -> other"), and the nodes only one of them has.
    std::string diff(const program_strategy& other) const;

    /// "in [dp, -], [-, tp] out [dp, tp]" (without "out" when the results are not known, as
    /// in a strategy read from a file).
    static std::string choice_text(const layout_choice& c);

    static std::string seconds_text(double s);
};

namespace detail {

/// A pairwise cost problem: per variable, the cost of each of its values; per edge (a, b),
/// the cost of each pair of values, row-major in a's values.
struct cost_problem {
    struct edge {
        std::size_t a = 0, b = 0;
        std::vector<double> cost;
    };
    std::vector<std::vector<double>> unary;
    std::vector<edge> edges;

    /// The cost of `pick` (one value per variable).
    double total(const std::vector<std::size_t>& pick) const;
};

/// The minimum of a cost_problem by elimination (see the file comment): exact while the
/// branches it tries stay within `branch_budget` values in all; beyond, it fixes a
/// branching variable to its best value against its neighbours' cheapest (and says so).
class cost_minimizer {
public:
    explicit cost_minimizer(const cost_problem& p, std::size_t branch_budget = 100000);

    struct solution {
        double cost = 0;
        std::vector<std::size_t> pick;
        std::size_t branched = 0; ///< variables branched on
        bool exact = true;
    };

    /// Adds `weight` times `extra[v][value]` to each value's own cost: the price of a figure
    /// the values carry (a Lagrange multiplier's, for a cap on it).
    void add_to_unary(const std::vector<std::vector<double>>& extra, double weight);

    /// The minimum and one value per variable reaching it.
    solution solve();

private:
    static constexpr std::size_t npos = std::size_t(-1);

    /// A table over (lo, hi) with lo < hi, row-major in lo's values.
    struct pair_table {
        std::size_t cols = 0;
        std::vector<double> c;
        double& at(std::size_t i, std::size_t j, bool swapped) {
            return swapped ? c[j * cols + i] : c[i * cols + j];
        }
        double get(std::size_t i, std::size_t j, bool swapped) const {
            return swapped ? c[j * cols + i] : c[i * cols + j];
        }
    };

    /// How an eliminated variable's value follows from its neighbours' (kind 0: its own
    /// best, `constant` its cost; 1: from u's; 2: from u's and w's, `best` row-major in u's).
    struct record {
        int kind = 0;
        std::size_t v = 0, u = 0, w = 0, kw = 0;
        std::vector<std::size_t> best;
        double constant = 0;
    };

    std::size_t size(std::size_t v) const { return unary_[v].size(); }

    pair_table& table(std::size_t a, std::size_t b);

    double cost(std::size_t a, std::size_t ia, std::size_t b, std::size_t ib) const {
        return tables_.at(std::minmax(a, b)).get(ia, ib, a > b);
    }

    void remove(std::size_t v);

    /// Fixes v to value c: its edges fold into its neighbours; returns its own cost.
    double fix(std::size_t v, std::size_t c);

    /// v's best value against its neighbours' cheapest: where the budget ends.
    std::size_t greedy_value(std::size_t v) const;

    /// Eliminates v (at most two neighbours) into its neighbours.
    record eliminate(std::size_t v);

    /// The eliminated variables' values, last eliminated first; returns their constants' sum.
    static double back_substitute(const std::vector<record>& done, std::vector<std::size_t>& pick);

    /// Eliminates every variable, branching where each has three neighbours or more; fills
    /// `pick` and returns the minimum.
    double run(std::vector<std::size_t>& pick, std::size_t& branched, std::size_t& spent,
               bool& exact);

    std::vector<std::vector<double>> unary_;
    std::vector<std::set<std::size_t>> nbr_;
    std::vector<bool> alive_;
    std::size_t budget_;
    std::map<std::pair<std::size_t, std::size_t>, pair_table> tables_;
};

/// A pick of a cost_problem within a cap on a figure its values carry (minimize_within).
struct capped_solution {
    std::vector<std::size_t> pick;
    double cost = 0;   ///< the pick's cost
    double figure = 0; ///< the pick's figure, at most the cap
    /// No pick within the cap costs less (Lagrangian duality); `cost` is the minimum when
    /// the two are equal.
    double bound = 0;
    std::size_t branched = 0; ///< variables branched on, over every solve
    bool exact = true;        ///< `cost` equals `bound` (to 1e-9 of it)
};

/// The least figure a pick reaches: each variable's least, added.
XSHARD_DECL double least_figure(const std::vector<std::vector<double>>& figure);

/// The cheapest pick of `p` whose figure (`figure[v][value]`, added over the variables) is
/// at most `cap`, or none when the least figure exceeds it. Where the minimum is within the
/// cap, it. Else Lagrangian relaxation: the minimum of cost + lambda x figure for lambda
/// bisected between a pick over the cap and one within it, keeping the cheapest pick within
/// the cap and the best lower bound (each solve's minimum less lambda x cap); then one
/// variable, or both ends of an edge, move to values that cost less and keep the pick within
/// the cap, until none can.
XSHARD_DECL std::optional<capped_solution>
minimize_within(const cost_problem& p, const std::vector<std::vector<double>>& figure, double cap,
                std::size_t branch_budget = 100000);

/// A cost_problem whose variables of one class take the same value (tie).
struct tied_problem {
    cost_problem problem;
    std::vector<std::vector<double>> figure;
    std::vector<std::size_t> variable; ///< each original variable's in `problem`

    /// The original problem's pick of a pick of this one.
    std::vector<std::size_t> expand(const std::vector<std::size_t>& pick) const;
};

/// `p` and its `figure` with the variables of each class tied: one variable per class, its
/// own costs and figure the sums of its members', an edge within a class its diagonal, an
/// edge between classes kept (parallel ones add up). `representative[v]` names v's class by
/// one member, whose values are v's.
XSHARD_DECL tied_problem tie(const cost_problem& p, const std::vector<std::vector<double>>& figure,
                             const std::vector<std::size_t>& representative);

/// The runs of consecutive identical blocks in a sequence of signatures: at each place the
/// run covering the most, of the shortest block among equals, then on after it.
XSHARD_DECL std::vector<repeated_block>
find_repeated_blocks(const std::vector<std::size_t>& signature);

/// One way a node can run: the layouts it asks of its operands, the rule's answer, its
/// compute in seconds (forward and backward), and its results' bytes on the rank holding
/// the most.
struct node_way {
    std::vector<layout> asked;
    layout_choice choice;
    double compute = 0;
    std::size_t result_bytes = 0;
};

/// Every layout of a rank-r operand with each mesh axis (of size above 1) on at most one
/// dimension, or on none; at most `most_axes` axes placed.
XSHARD_DECL std::vector<layout> operand_layouts(std::size_t r, const mesh_shape& mesh,
                                                std::size_t most_axes);

/// The shard rank 0 holds of a value of `global` shape laid out as `l`: the largest (the
/// first blocks of a dimension take the elements an uneven split leaves over).
inline shard_type largest_shard(const value_shape& global, const layout& l, dtype t,
                                const mesh_shape& mesh) {
    return local_shard_of(global, l, t, mesh_view{mesh, 0, mesh.coords(0), {}});
}

/// A program's ways and costs on a mesh as a cost_problem (one variable per node), and the
/// strategy a solution of it is.
class program_costs {
public:
    program_costs(const program& p, const mesh_shape& mesh, const program_search_options& o);

    const cost_problem& problem() const noexcept { return problem_; }
    /// Each node's counterpart in the first block of its run of repeated blocks (itself
    /// outside such runs, or without share_repeated_blocks): they run alike.
    const std::vector<std::size_t>& representatives() const noexcept { return representative_; }
    /// The runs of repeated blocks.
    const std::vector<repeated_block>& repeated() const noexcept { return repeated_; }
    /// Each way's bytes per rank: its results (kept for the backward pass), and the weights
    /// it is the first to read with their gradients and optimizer state.
    const std::vector<std::vector<double>>& memory() const noexcept { return memory_; }
    const std::vector<std::vector<node_way>>& ways() const noexcept { return ways_; }

    /// The strategy of `pick` (one way per node), explained.
    program_strategy strategy(const std::vector<std::size_t>& pick, std::size_t branched) const;

private:
    static constexpr std::size_t npos = std::size_t(-1);

    /// Finds the runs of repeated blocks: nodes alike in their primitive, attributes,
    /// annotation, operands' and results' shapes and types, and in where their operands come
    /// from (a node so many places before, a weight used here first or so many nodes after
    /// its first use, an input), so that counterparts have the same ways.
    void share_repeated_blocks();

    /// A weight's bytes on the rank holding the most, laid out `l`, with its gradient and
    /// optimizer state.
    std::size_t weight_bytes(const program_value& v, const layout& l) const {
        return local_bytes(v, l) * std::size_t(2 + o_.machine.optimizer_states);
    }

    /// A weight's bytes on the rank holding the most, laid out `l`.
    std::size_t local_bytes(const program_value& v, const layout& l) const {
        return volume(largest_shard(v.shape, l, v.type, mesh_).local) * element_bytes(v.type);
    }

    /// Whether node n keeps the operands' layouts of its annotation.
    bool annotated(const program_node& n) const {
        return o_.keep_annotations &&
               (!n.annotation.in_layouts.empty() || !n.annotation.in_strategies.empty());
    }

    /// Which values a cotangent reaches (as the compiled program's backward pass).
    void mark_gradients();

    std::vector<operand_type> types_of(const program_node& n) const;

    /// The rule's choice for `asked`, or none when the node cannot run so.
    std::optional<node_way> try_way(const program_node& n, std::span<const operand_type> types,
                                    std::vector<layout> asked) const;

    /// The ways node `n` can run: its annotation's alone (kept), or every combination of its
    /// operands' layouts the rule accepts, distinct, the cheapest `max_ways`.
    std::vector<node_way> ways_of(const program_node& n) const;

    /// The planner's price of moving a value of `shape` from `from` to `to`.
    double price(const layout& from, const layout& to, const value_shape& shape, dtype t) const;

    template <std::size_t... N>
    static double priced(const redistribution_pricer& pricer, const layout& from, const layout& to,
                         const value_shape& shape, std::index_sequence<N...>) {
        double s = 0;
        ((shape.size() == N ? (s = pricer.seconds(from, to, to_array<N>(shape)), 0) : 0), ...);
        return s;
    }

    template <std::size_t N>
    static std::array<std::size_t, N> to_array(const value_shape& s) {
        std::array<std::size_t, N> a{};
        for (std::size_t i = 0; i < N; ++i)
            a[i] = s[i];
        return a;
    }

    /// A value laid out `from` read as `to`: forward, and its cotangent back.
    double edge_price(std::size_t id, const layout& from, const layout& to) const;

    /// The layout node k's way i keeps its result j in.
    const layout& kept(std::size_t k, std::size_t i, std::size_t j) const;

    /// Adds `f(a, b)` over every pair of ways of nodes a < b to their edge.
    template <class F>
    void add_pair(std::size_t a, std::size_t b, F&& f) {
        auto it = edge_index_.find({a, b});
        if (it == edge_index_.end()) {
            problem_.edges.push_back(
                {a, b, std::vector<double>(ways_[a].size() * ways_[b].size(), 0.0)});
            it = edge_index_.emplace(std::make_pair(a, b), problem_.edges.size() - 1).first;
        }
        auto& cost = problem_.edges[it->second].cost;
        for (std::size_t ia = 0; ia < ways_[a].size(); ++ia)
            for (std::size_t ib = 0; ib < ways_[b].size(); ++ib)
                cost[ia * ways_[b].size() + ib] += f(ia, ib);
    }

    void add_edges();

    /// Node k reads weight `id` as operand i: the first use lays the weight out and pays its
    /// gradient synchronisation and its update; a later use reads it from there.
    void add_weight_use(std::size_t k, std::size_t i, std::size_t id);

    /// The edge of value `id` from node a (its way ia keeps it as `from(ia)`) to node b (its
    /// way ib reads it as `to(ib)`): each distinct pair of layouts priced once.
    template <class From, class To>
    void add_value_edge(std::size_t id, std::size_t a, std::size_t b, From&& from, To&& to) {
        auto distinct = [](std::size_t count, auto&& layout_of) {
            std::vector<layout> layouts;
            std::vector<std::size_t> index(count);
            for (std::size_t i = 0; i < count; ++i) {
                const layout& l = layout_of(i);
                auto it = std::find(layouts.begin(), layouts.end(), l);
                index[i] = std::size_t(it - layouts.begin());
                if (it == layouts.end())
                    layouts.push_back(l);
            }
            return std::make_pair(std::move(layouts), std::move(index));
        };
        const auto sources = distinct(ways_[a].size(), from);
        const auto targets = distinct(ways_[b].size(), to);
        const std::size_t columns = targets.first.size();
        std::vector<double> prices(sources.first.size() * columns);
        for (std::size_t s = 0; s < sources.first.size(); ++s)
            for (std::size_t t = 0; t < columns; ++t)
                prices[s * columns + t] = edge_price(id, sources.first[s], targets.first[t]);
        add_pair(a, b, [&](std::size_t ia, std::size_t ib) {
            return prices[sources.second[ia] * columns + targets.second[ib]];
        });
    }

    /// Node k's best other way with every other node as picked that keeps the strategy
    /// within the memory cap, and what it loses by.
    void runner_up(std::size_t k, const std::vector<std::size_t>& pick, node_strategy& ns) const;

    const program& p_;
    mesh_shape mesh_;
    program_search_options o_;
    std::vector<std::pair<std::size_t, std::size_t>> producer_;
    std::map<std::size_t, layout> inputs_;
    std::vector<bool> gradient_;
    std::vector<std::vector<node_way>> ways_;
    cost_problem problem_;
    std::map<std::pair<std::size_t, std::size_t>, std::size_t> edge_index_;
    std::map<std::size_t, std::pair<std::size_t, std::size_t>> first_use_;
    std::vector<std::vector<double>> sync_;
    std::vector<std::vector<double>> memory_;
    std::vector<std::size_t> representative_;
    std::vector<repeated_block> repeated_;
    mutable std::map<std::size_t, redistribution_pricer> pricers_;
    /// A redistribution the search has priced: its layouts, the value's shape and type.
    struct price_key {
        layout from, to;
        value_shape shape;
        dtype type;
        bool operator==(const price_key&) const = default;
    };
    struct price_key_hash {
        std::size_t operator()(const price_key& k) const noexcept;
    };
    mutable std::unordered_map<price_key, double, price_key_hash> prices_;
};

} // namespace detail

/// Searches a strategy for every node of `p` on a mesh of shape `mesh` (see the file
/// comment); no MPI, so a single process searches for a mesh of any size. Throws
/// xshard::error naming the node when an annotation kept cannot run on the mesh, or a node
/// has no way to run on it; and naming the least bytes per rank when no strategy fits
/// `memory_per_rank`.
XSHARD_DECL program_strategy search_program(const program& p, const mesh_shape& mesh,
                                            const program_search_options& options = {});

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/search/program_search.ipp>
#endif
