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
    void apply(program& p) const {
        for (const auto& n : nodes) {
            auto& node = p.node(n.node);
            node.annotation.in_strategies.clear();
            node.annotation.in_layouts = n.layouts.operands;
            node.annotation.out_layouts = n.out_layouts;
        }
    }

    /// Every node's choice, what it costs and the runner-up, then the step's predicted time
    /// and the weights' memory per rank: why the search chose what it chose.
    std::string explain() const {
        std::string s = "strategy on mesh(" + mesh.to_string() + "): " + seconds_text(seconds) +
                        " per step predicted; per rank " + std::to_string(weight_bytes) +
                        " bytes of weights, gradients and optimizer state, " +
                        std::to_string(activation_bytes) + " bytes of activations\n";
        for (const auto& r : repeated)
            s += "  " + std::to_string(r.count) + " repeated blocks of " + std::to_string(r.nodes) +
                 " nodes from " + r.first_name + ", searched once\n";
        if (memory_cap != std::numeric_limits<double>::infinity()) {
            char cap[32];
            std::snprintf(cap, sizeof cap, "%.0f", memory_cap);
            s += "  within the cap of " + std::string(cap) + " bytes per rank; ";
            s += lower_bound < seconds
                     ? "no strategy within it is faster than " + seconds_text(lower_bound) + "\n"
                     : "the fastest within it\n";
        }
        for (const auto& n : nodes) {
            s += "  " + n.node + " (" + n.op + ")" + (n.annotated ? " annotated" : "") + ": " +
                 choice_text(n.layouts) + "\n    compute " + seconds_text(n.compute) +
                 ", communication " + seconds_text(n.communication) +
                 ", gradient sync and update " + seconds_text(n.gradient_sync) + "; " +
                 std::to_string(n.ways) + " ways";
            if (n.runner_up)
                s += "; runner-up " + choice_text(*n.runner_up) + " loses " +
                     seconds_text(n.runner_up_loss);
            s += "\n";
        }
        return s;
    }

    /// The nodes whose layouts differ between this strategy and `other`, one line each
    /// ("name: this -> other"), and the nodes only one of them has.
    std::string diff(const program_strategy& other) const {
        std::string s;
        std::map<std::string, const node_strategy*> theirs;
        for (const auto& n : other.nodes)
            theirs[n.node] = &n;
        for (const auto& n : nodes) {
            auto it = theirs.find(n.node);
            if (it == theirs.end()) {
                s += n.node + ": only in the first\n";
                continue;
            }
            if (it->second->layouts.operands != n.layouts.operands)
                s += n.node + ": " + choice_text(n.layouts) + " -> " +
                     choice_text(it->second->layouts) + "\n";
            theirs.erase(it);
        }
        for (const auto& [name, n] : theirs)
            s += name + ": only in the second\n";
        return s;
    }

    /// "in [dp, -], [-, tp] out [dp, tp]" (without "out" when the results are not known, as
    /// in a strategy read from a file).
    static std::string choice_text(const layout_choice& c) {
        std::string s = "in ";
        for (std::size_t i = 0; i < c.operands.size(); ++i)
            s += (i ? ", " : "") + c.operands[i].to_string();
        for (std::size_t i = 0; i < c.results.size(); ++i)
            s += (i ? ", " : " out ") + c.results[i].to_string();
        return s;
    }

    static std::string seconds_text(double s) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.3g s", s);
        return buf;
    }
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
    double total(const std::vector<std::size_t>& pick) const {
        double t = 0;
        for (std::size_t v = 0; v < unary.size(); ++v)
            t += unary[v][pick[v]];
        for (const auto& e : edges)
            t += e.cost[pick[e.a] * unary[e.b].size() + pick[e.b]];
        return t;
    }
};

/// The minimum of a cost_problem by elimination (see the file comment): exact while the
/// branches it tries stay within `branch_budget` values in all; beyond, it fixes a
/// branching variable to its best value against its neighbours' cheapest (and says so).
class cost_minimizer {
public:
    explicit cost_minimizer(const cost_problem& p, std::size_t branch_budget = 100000)
        : unary_(p.unary)
        , nbr_(p.unary.size())
        , alive_(p.unary.size(), true)
        , budget_(branch_budget) {
        for (const auto& e : p.edges) {
            if (e.a == e.b)
                throw std::invalid_argument("xshard: cost_minimizer: an edge from a variable to "
                                            "itself");
            auto& t = table(e.a, e.b);
            for (std::size_t i = 0; i < size(e.a); ++i)
                for (std::size_t j = 0; j < size(e.b); ++j)
                    t.at(i, j, e.a > e.b) += e.cost[i * size(e.b) + j];
        }
    }

    struct solution {
        double cost = 0;
        std::vector<std::size_t> pick;
        std::size_t branched = 0; ///< variables branched on
        bool exact = true;
    };

    /// Adds `weight` times `extra[v][value]` to each value's own cost: the price of a figure
    /// the values carry (a Lagrange multiplier's, for a cap on it).
    void add_to_unary(const std::vector<std::vector<double>>& extra, double weight) {
        for (std::size_t v = 0; v < unary_.size(); ++v)
            for (std::size_t c = 0; c < unary_[v].size(); ++c)
                unary_[v][c] += weight * extra[v][c];
    }

    /// The minimum and one value per variable reaching it.
    solution solve() {
        solution s;
        std::size_t spent = 0;
        s.cost = run(s.pick, s.branched, spent, s.exact);
        return s;
    }

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

    pair_table& table(std::size_t a, std::size_t b) {
        const auto key = std::minmax(a, b);
        auto it = tables_.find(key);
        if (it == tables_.end()) {
            pair_table t;
            t.cols = size(key.second);
            t.c.assign(size(key.first) * t.cols, 0.0);
            it = tables_.emplace(key, std::move(t)).first;
            nbr_[a].insert(b);
            nbr_[b].insert(a);
        }
        return it->second;
    }

    double cost(std::size_t a, std::size_t ia, std::size_t b, std::size_t ib) const {
        return tables_.at(std::minmax(a, b)).get(ia, ib, a > b);
    }

    void remove(std::size_t v) {
        for (auto u : nbr_[v]) {
            tables_.erase(std::minmax(u, v));
            nbr_[u].erase(v);
        }
        nbr_[v].clear();
        alive_[v] = false;
    }

    /// Fixes v to value c: its edges fold into its neighbours; returns its own cost.
    double fix(std::size_t v, std::size_t c) {
        for (auto u : nbr_[v])
            for (std::size_t iu = 0; iu < size(u); ++iu)
                unary_[u][iu] += cost(v, c, u, iu);
        const double own = unary_[v][c];
        remove(v);
        return own;
    }

    /// v's best value against its neighbours' cheapest: where the budget ends.
    std::size_t greedy_value(std::size_t v) const {
        std::size_t best = 0;
        double low = std::numeric_limits<double>::infinity();
        for (std::size_t c = 0; c < size(v); ++c) {
            double t = unary_[v][c];
            for (auto u : nbr_[v]) {
                double m = std::numeric_limits<double>::infinity();
                for (std::size_t iu = 0; iu < size(u); ++iu)
                    m = std::min(m, unary_[u][iu] + cost(v, c, u, iu));
                t += m;
            }
            if (t < low) {
                low = t;
                best = c;
            }
        }
        return best;
    }

    /// Eliminates v (at most two neighbours) into its neighbours.
    record eliminate(std::size_t v) {
        record r;
        r.v = v;
        const std::vector<std::size_t> n(nbr_[v].begin(), nbr_[v].end());
        const auto inf = std::numeric_limits<double>::infinity();
        if (n.empty()) {
            r.best = {std::size_t(std::min_element(unary_[v].begin(), unary_[v].end()) -
                                  unary_[v].begin())};
            r.constant = unary_[v][r.best[0]];
        } else if (n.size() == 1) {
            r.kind = 1;
            r.u = n[0];
            r.best.assign(size(r.u), 0);
            for (std::size_t iu = 0; iu < size(r.u); ++iu) {
                double low = inf;
                for (std::size_t iv = 0; iv < size(v); ++iv) {
                    const double c = unary_[v][iv] + cost(v, iv, r.u, iu);
                    if (c < low) {
                        low = c;
                        r.best[iu] = iv;
                    }
                }
                unary_[r.u][iu] += low;
            }
        } else {
            r.kind = 2;
            r.u = n[0];
            r.w = n[1];
            r.kw = size(r.w);
            const std::size_t ku = size(r.u), kv = size(v);
            std::vector<double> folded(ku * r.kw, inf);
            r.best.assign(ku * r.kw, 0);
            for (std::size_t iu = 0; iu < ku; ++iu)
                for (std::size_t iv = 0; iv < kv; ++iv) {
                    const double left = unary_[v][iv] + cost(v, iv, r.u, iu);
                    for (std::size_t iw = 0; iw < r.kw; ++iw) {
                        const double c = left + cost(v, iv, r.w, iw);
                        if (c < folded[iu * r.kw + iw]) {
                            folded[iu * r.kw + iw] = c;
                            r.best[iu * r.kw + iw] = iv;
                        }
                    }
                }
            remove(v);
            auto& t = table(r.u, r.w);
            for (std::size_t iu = 0; iu < ku; ++iu)
                for (std::size_t iw = 0; iw < r.kw; ++iw)
                    t.at(iu, iw, r.u > r.w) += folded[iu * r.kw + iw];
            return r;
        }
        remove(v);
        return r;
    }

    /// The eliminated variables' values, last eliminated first; returns their constants' sum.
    static double back_substitute(const std::vector<record>& done, std::vector<std::size_t>& pick) {
        double total = 0;
        for (auto it = done.rbegin(); it != done.rend(); ++it) {
            if (it->kind == 0) {
                pick[it->v] = it->best[0];
                total += it->constant;
            } else if (it->kind == 1) {
                pick[it->v] = it->best[pick[it->u]];
            } else {
                pick[it->v] = it->best[pick[it->u] * it->kw + pick[it->w]];
            }
        }
        return total;
    }

    /// Eliminates every variable, branching where each has three neighbours or more; fills
    /// `pick` and returns the minimum.
    double run(std::vector<std::size_t>& pick, std::size_t& branched, std::size_t& spent,
               bool& exact) {
        std::vector<record> done;
        double fixed = 0;
        while (true) {
            std::size_t v = npos, low = npos;
            for (std::size_t i = 0; i < alive_.size(); ++i)
                if (alive_[i] && (v == npos || nbr_[i].size() < low)) {
                    v = i;
                    low = nbr_[i].size();
                }
            if (v == npos)
                break;
            if (low < 3) {
                done.push_back(eliminate(v));
                continue;
            }
            ++branched;
            if (spent + size(v) > budget_) {
                exact = false;
                const auto c = greedy_value(v);
                fixed += fix(v, c);
                done.push_back({0, v, 0, 0, 0, {c}, 0});
                continue;
            }
            spent += size(v);
            double best = std::numeric_limits<double>::infinity();
            for (std::size_t c = 0; c < size(v); ++c) {
                cost_minimizer trial = *this;
                const double own = trial.fix(v, c);
                std::vector<std::size_t> p(unary_.size(), 0);
                const double t = own + trial.run(p, branched, spent, exact);
                if (t < best) {
                    best = t;
                    pick = std::move(p);
                    pick[v] = c;
                }
            }
            return fixed + best + back_substitute(done, pick);
        }
        pick.assign(unary_.size(), 0);
        return fixed + back_substitute(done, pick);
    }

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
    std::vector<std::size_t> expand(const std::vector<std::size_t>& pick) const {
        std::vector<std::size_t> all(variable.size());
        for (std::size_t v = 0; v < variable.size(); ++v)
            all[v] = pick[variable[v]];
        return all;
    }
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
    program_costs(const program& p, const mesh_shape& mesh, const program_search_options& o)
        : p_(p)
        , mesh_(mesh)
        , o_(o) {
        const auto& values = p.values();
        producer_.assign(values.size(), {npos, 0});
        for (std::size_t k = 0; k < p.nodes().size(); ++k)
            for (std::size_t j = 0; j < p.nodes()[k].results.size(); ++j)
                producer_[p.nodes()[k].results[j]] = {k, j};
        const auto dataset = dataset_axes_of(o.layouts, mesh);
        for (auto id : p.inputs()) {
            auto it = o.layouts.input_layouts.find(values[id].name);
            inputs_[id] = it != o.layouts.input_layouts.end()
                              ? it->second
                              : batch_layout(values[id].shape.size(), dataset);
        }
        mark_gradients();
        representative_.resize(p.nodes().size());
        for (std::size_t k = 0; k < representative_.size(); ++k)
            representative_[k] = k;
        if (o.share_repeated_blocks)
            share_repeated_blocks();
        for (std::size_t k = 0; k < p.nodes().size(); ++k)
            ways_.push_back(representative_[k] == k ? ways_of(p.nodes()[k])
                                                    : ways_[representative_[k]]);
        problem_.unary.resize(ways_.size());
        memory_.resize(ways_.size());
        for (std::size_t k = 0; k < ways_.size(); ++k)
            for (const auto& w : ways_[k]) {
                problem_.unary[k].push_back(w.compute);
                memory_[k].push_back(double(w.result_bytes));
            }
        add_edges();
    }

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
    program_strategy strategy(const std::vector<std::size_t>& pick, std::size_t branched) const {
        program_strategy s;
        s.mesh = mesh_;
        s.seconds = problem_.total(pick);
        s.branched = branched;
        for (std::size_t k = 0; k < ways_.size(); ++k) {
            const auto& n = p_.nodes()[k];
            const auto& w = ways_[k][pick[k]];
            node_strategy ns;
            ns.node = n.name;
            ns.op = n.op;
            ns.layouts = w.choice;
            ns.annotated = annotated(n);
            if (o_.keep_annotations)
                ns.out_layouts = n.annotation.out_layouts;
            ns.ways = ways_[k].size();
            ns.compute = w.compute;
            ns.gradient_sync = sync_[k].empty() ? 0 : sync_[k][pick[k]];
            // What the node's own price holds beyond compute and synchronisation (rounding
            // leaves a few ulps where that is nothing: 0).
            ns.communication =
                std::max(0.0, problem_.unary[k][pick[k]] - ns.compute - ns.gradient_sync);
            for (const auto& e : problem_.edges)
                if (e.b == k)
                    ns.communication += e.cost[pick[e.a] * ways_[k].size() + pick[k]];
            runner_up(k, pick, ns);
            s.nodes.push_back(std::move(ns));
        }
        for (std::size_t i = 0; i < p_.weights().size(); ++i) {
            const auto id = p_.weights()[i];
            const auto [k, operand] = first_use_.at(id);
            s.weight_bytes +=
                weight_bytes(p_.value(id), whole_terms(ways_[k][pick[k]].choice.operands[operand]));
        }
        for (std::size_t k = 0; k < ways_.size(); ++k)
            s.activation_bytes += ways_[k][pick[k]].result_bytes;
        s.repeated = repeated_;
        return s;
    }

private:
    static constexpr std::size_t npos = std::size_t(-1);

    /// Finds the runs of repeated blocks: nodes alike in their primitive, attributes,
    /// annotation, operands' and results' shapes and types, and in where their operands come
    /// from (a node so many places before, a weight used here first or so many nodes after
    /// its first use, an input), so that counterparts have the same ways.
    void share_repeated_blocks() {
        const auto& nodes = p_.nodes();
        std::map<std::size_t, std::size_t> first_reader;
        std::map<std::string, std::size_t> interned;
        std::vector<std::size_t> signature;
        auto shape_of = [](const program_value& v) {
            std::string t = std::string(to_string(v.type)) + "[";
            for (auto d : v.shape)
                t += std::to_string(d) + ",";
            return t + "]";
        };
        for (std::size_t k = 0; k < nodes.size(); ++k) {
            const auto& n = nodes[k];
            std::string sig = n.op + "|";
            if (n.custom) {
                char address[32];
                std::snprintf(address, sizeof address, "%p",
                              static_cast<const void*>(n.custom.get()));
                sig += address;
            }
            for (auto i : n.attributes.ints)
                sig += std::to_string(i) + ",";
            sig += "|";
            for (auto r : n.attributes.reals) {
                char real[32];
                std::snprintf(real, sizeof real, "%a,", r);
                sig += real;
            }
            if (annotated(n) || (o_.keep_annotations && !n.annotation.out_layouts.empty()))
                sig += "|" + n.annotation.to_string();
            for (auto id : n.operands) {
                const auto& v = p_.value(id);
                sig += "|" + shape_of(v);
                if (v.kind == value_kind::input) {
                    sig += "input " + v.name;
                } else if (v.kind == value_kind::weight) {
                    const auto [it, first] = first_reader.emplace(id, k);
                    sig += first ? "weight" : "weight read " + std::to_string(k - it->second);
                } else {
                    sig +=
                        "node " + std::to_string(k - v.node) + ":" + std::to_string(v.result_index);
                }
            }
            for (auto id : n.results)
                sig += "|" + shape_of(p_.value(id)) + (gradient_[id] ? "g" : "");
            signature.push_back(interned.emplace(std::move(sig), interned.size()).first->second);
        }
        repeated_ = find_repeated_blocks(signature);
        for (auto& r : repeated_) {
            r.first_name = nodes[r.first].name;
            for (std::size_t b = 1; b < r.count; ++b)
                for (std::size_t j = 0; j < r.nodes; ++j)
                    representative_[r.first + b * r.nodes + j] = r.first + j;
        }
    }

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
    void mark_gradients() {
        const auto& values = p_.values();
        gradient_.assign(values.size(), false);
        for (auto id : p_.weights())
            gradient_[id] = true;
        for (auto id : p_.inputs())
            gradient_[id] = o_.input_gradients && values[id].type != dtype::i64;
        for (const auto& n : p_.nodes()) {
            bool any = false;
            for (auto id : n.operands)
                any = any || gradient_[id];
            const bool differentiable = n.custom || rules_named(n.op).differentiable;
            for (auto id : n.results)
                gradient_[id] = any && differentiable && values[id].type != dtype::i64;
        }
    }

    std::vector<operand_type> types_of(const program_node& n) const {
        std::vector<operand_type> types;
        for (auto id : n.operands) {
            const auto& v = p_.value(id);
            types.push_back({v.shape, v.type, v.kind == value_kind::weight});
        }
        return types;
    }

    /// The rule's choice for `asked`, or none when the node cannot run so.
    std::optional<node_way> try_way(const program_node& n, std::span<const operand_type> types,
                                    std::vector<layout> asked) const {
        node_way w;
        w.asked = asked;
        try {
            w.choice = n.custom
                           ? n.custom->rule(types, std::move(asked), mesh_)
                           : rules_named(n.op).rule(n.attributes, types, std::move(asked), mesh_);
            // A rule may hand back what no mesh can hold (an axis on two dimensions).
            for (const auto& l : w.choice.operands)
                l.validate(mesh_);
            for (const auto& l : w.choice.results)
                l.validate(mesh_);
        } catch (const std::invalid_argument&) {
            return std::nullopt;
        } catch (const error&) {
            return std::nullopt;
        }
        std::vector<shard_type> ops, res;
        double bytes = 0;
        for (std::size_t i = 0; i < types.size(); ++i) {
            ops.push_back(
                largest_shard(types[i].shape, w.choice.operands[i], types[i].type, mesh_));
            bytes += double(volume(ops.back().local) * element_bytes(types[i].type));
        }
        for (std::size_t i = 0; i < n.results.size(); ++i) {
            const auto& v = p_.value(n.results[i]);
            res.push_back(largest_shard(v.shape, w.choice.results[i], v.type, mesh_));
            w.result_bytes += volume(res.back().local) * element_bytes(v.type);
            bytes += double(volume(res.back().local) * element_bytes(v.type));
        }
        // The backward pass does about twice the forward's arithmetic when every floating
        // operand takes a cotangent (a matmul's two products), in proportion otherwise: a
        // first layer's input takes none, and a node that no cotangent reaches (none of its
        // results takes one) runs no VJP, so streams and evaluates nothing backward.
        bool reached = false;
        for (auto id : n.results)
            reached = reached || gradient_[id];
        double floating = 0, cotangents = 0;
        for (auto id : n.operands)
            if (p_.value(id).type != dtype::i64) {
                floating += 1;
                cotangents += reached && gradient_[id] ? 1 : 0;
            }
        const double backward = floating > 0 ? 2 * cotangents / floating : 0;
        static constexpr op_rules custom_rules{}; // a custom node's: the defaults
        const auto& rules = n.custom ? custom_rules : rules_named(n.op);
        const auto& a = n.attributes;
        const double flops = rules.flops ? rules.flops(a, ops, res) : 0;
        const double smallest = rules.gemm_dimension ? rules.gemm_dimension(a, ops, res) : 0;
        const double passes = rules.passes + (reached ? rules.backward_passes : 0);
        const double functions =
            ops.empty() ? 0
                        : (rules.transcendentals + (reached ? rules.backward_transcendentals : 0)) *
                              double(volume(ops[0].local));
        const double scratch = rules.scratch_traffic ? rules.scratch_traffic(a, ops, res) : 0;
        const double messages =
            rules.kernel_seconds ? rules.kernel_seconds(a, ops, res, mesh_, o_.machine.links) : 0;
        w.compute = (1 + backward) * o_.machine.gemm_seconds(flops, smallest) +
                    (passes * bytes + scratch) / o_.machine.memory_bandwidth +
                    functions * o_.machine.transcendental_seconds + messages;
        w.compute *= o_.machine.scale_of(n.op);
        return w;
    }

    /// The ways node `n` can run: its annotation's alone (kept), or every combination of its
    /// operands' layouts the rule accepts, distinct, the cheapest `max_ways`.
    std::vector<node_way> ways_of(const program_node& n) const {
        const auto types = types_of(n);
        std::vector<node_way> ways;
        if (annotated(n)) {
            const op_rules* rules = n.custom ? nullptr : &rules_named(n.op);
            std::optional<node_way> w;
            std::string why = "its sharding rule refuses it";
            try {
                std::vector<layout> asked = n.annotation.in_layouts;
                if (asked.empty())
                    asked = rules ? rules->resolve(n.annotation.in_strategies, mesh_)
                                  : resolve_each(n.annotation.in_strategies, mesh_);
                w = try_way(n, types, std::move(asked));
            } catch (const std::exception& e) {
                why = e.what();
            }
            if (!w)
                throw error("xshard: search: node " + n.name + " (" + n.op + ") shard " +
                            n.annotation.to_string() + " cannot run on mesh(" + mesh_.to_string() +
                            "): " + why);
            return {std::move(*w)};
        }
        // Each operand's layouts; where their combinations are too many, the later operands
        // place at most one axis.
        std::vector<std::vector<layout>> each;
        double combinations = 1;
        for (const auto& t : types) {
            each.push_back(operand_layouts(t.shape.size(), mesh_, mesh_.ndim()));
            combinations *= double(each.back().size());
        }
        for (std::size_t i = 1; combinations > 20000 && i < types.size(); ++i) {
            combinations /= double(each[i].size());
            each[i] = operand_layouts(types[i].shape.size(), mesh_, 1);
            combinations *= double(each[i].size());
        }
        std::set<std::string> seen;
        std::vector<std::size_t> at(types.size(), 0);
        while (true) {
            std::vector<layout> asked;
            for (std::size_t i = 0; i < types.size(); ++i)
                asked.push_back(each[i][at[i]]);
            if (auto w = try_way(n, types, asked)) {
                if (seen.insert(program_strategy::choice_text(w->choice)).second)
                    ways.push_back(std::move(*w));
            }
            std::size_t i = 0;
            while (i < at.size() && ++at[i] == each[i].size())
                at[i++] = 0;
            if (i == at.size())
                break;
        }
        if (ways.empty())
            throw error("xshard: search: node " + n.name + " (" + n.op +
                        ") has no way to run on mesh(" + mesh_.to_string() + ")");
        if (ways.size() > o_.max_ways) {
            std::stable_sort(ways.begin(), ways.end(), [](const node_way& a, const node_way& b) {
                return a.compute < b.compute;
            });
            ways.resize(o_.max_ways);
        }
        return ways;
    }

    /// The planner's price of moving a value of `shape` from `from` to `to`.
    double price(const layout& from, const layout& to, const value_shape& shape, dtype t) const {
        if (from == to)
            return 0;
        price_key key{from, to, shape, t};
        if (auto it = prices_.find(key); it != prices_.end())
            return it->second;
        auto it = pricers_.find(element_bytes(t));
        if (it == pricers_.end())
            it = pricers_
                     .emplace(element_bytes(t),
                              redistribution_pricer(mesh_, o_.machine.links, element_bytes(t)))
                     .first;
        const double s =
            priced(it->second, from, to, shape, std::make_index_sequence<max_tensor_rank + 1>{});
        prices_.emplace(std::move(key), s);
        return s;
    }

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
    double edge_price(std::size_t id, const layout& from, const layout& to) const {
        const auto& v = p_.value(id);
        double s = price(from, to, v.shape, v.type);
        if (gradient_[id])
            s += price(cotangent_layout(to, mesh_), cotangent_layout(from, mesh_), v.shape, v.type);
        return s;
    }

    /// The layout node k's way i keeps its result j in.
    const layout& kept(std::size_t k, std::size_t i, std::size_t j) const {
        const auto& n = p_.nodes()[k];
        return o_.keep_annotations && j < n.annotation.out_layouts.size()
                   ? n.annotation.out_layouts[j]
                   : ways_[k][i].choice.results[j];
    }

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

    void add_edges() {
        sync_.assign(ways_.size(), {});
        for (std::size_t k = 0; k < ways_.size(); ++k) {
            const auto& n = p_.nodes()[k];
            for (std::size_t i = 0; i < n.operands.size(); ++i) {
                const auto id = n.operands[i];
                const auto& v = p_.value(id);
                if (v.kind == value_kind::input) {
                    for (std::size_t c = 0; c < ways_[k].size(); ++c)
                        problem_.unary[k][c] +=
                            edge_price(id, inputs_.at(id), ways_[k][c].choice.operands[i]);
                } else if (v.kind == value_kind::weight) {
                    add_weight_use(k, i, id);
                } else {
                    const std::size_t u = producer_[id].first, j = producer_[id].second;
                    add_value_edge(
                        id, u, k, [&](std::size_t iu) -> const layout& { return kept(u, iu, j); },
                        [&](std::size_t ik) -> const layout& {
                            return ways_[k][ik].choice.operands[i];
                        });
                }
            }
        }
    }

    /// Node k reads weight `id` as operand i: the first use lays the weight out and pays its
    /// gradient synchronisation and its update; a later use reads it from there.
    void add_weight_use(std::size_t k, std::size_t i, std::size_t id) {
        auto first = first_use_.find(id);
        if (first == first_use_.end()) {
            first_use_[id] = {k, i};
            const auto& v = p_.value(id);
            if (sync_[k].empty())
                sync_[k].assign(ways_[k].size(), 0.0);
            for (std::size_t c = 0; c < ways_[k].size(); ++c) {
                const auto w = whole_terms(ways_[k][c].choice.operands[i]);
                const double local = double(local_bytes(v, w));
                const double s = price(cotangent_layout(w, mesh_), w, v.shape, v.type) +
                                 o_.machine.update_seconds(local, local);
                sync_[k][c] += s;
                problem_.unary[k][c] += s;
                memory_[k][c] += double(weight_bytes(v, w));
            }
            return;
        }
        const std::size_t f = first->second.first, fi = first->second.second;
        auto weight = [&](std::size_t c) {
            return whole_terms(ways_[f][c].choice.operands[fi]);
        };
        if (f == k) {
            for (std::size_t c = 0; c < ways_[k].size(); ++c)
                problem_.unary[k][c] += edge_price(id, weight(c), ways_[k][c].choice.operands[i]);
            return;
        }
        std::vector<layout> first_layouts;
        for (std::size_t c = 0; c < ways_[f].size(); ++c)
            first_layouts.push_back(weight(c));
        add_value_edge(
            id, f, k, [&](std::size_t a) -> const layout& { return first_layouts[a]; },
            [&](std::size_t b) -> const layout& { return ways_[k][b].choice.operands[i]; });
    }

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
    void runner_up(std::size_t k, const std::vector<std::size_t>& pick, node_strategy& ns) const {
        double memory = 0;
        for (std::size_t v = 0; v < pick.size(); ++v)
            memory += memory_[v][pick[v]];
        auto local = [&](std::size_t c) {
            double t = problem_.unary[k][c];
            for (const auto& e : problem_.edges) {
                if (e.a == k)
                    t += e.cost[c * ways_[e.b].size() + pick[e.b]];
                else if (e.b == k)
                    t += e.cost[pick[e.a] * ways_[k].size() + c];
            }
            return t;
        };
        const double chosen = local(pick[k]);
        for (std::size_t c = 0; c < ways_[k].size(); ++c) {
            if (c == pick[k] || memory - memory_[k][pick[k]] + memory_[k][c] > o_.memory_per_rank)
                continue;
            const double loss = local(c) - chosen;
            if (!ns.runner_up || loss < ns.runner_up_loss) {
                ns.runner_up = ways_[k][c].choice;
                ns.runner_up_loss = loss;
            }
        }
    }

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
        std::size_t operator()(const price_key& k) const noexcept {
            std::size_t h = std::hash<layout>{}(k.from) * 31 + std::hash<layout>{}(k.to);
            for (const auto e : k.shape)
                h = h * 1000003 + e;
            return h * 7 + std::size_t(k.type);
        }
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
