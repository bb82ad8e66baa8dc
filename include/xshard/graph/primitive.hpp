#pragma once
/// \file
/// The one description of an operation that every transformation of a program reads (JAX's
/// Primitive, MindSpore's OperatorInfo): its shape rule, its sharding rule, its local kernel,
/// its vector-Jacobian product and its cost.
///
/// The element-type-free half (`op_rules`) serves tracing and planning; the kernels
/// (`primitive<T>`) serve execution. Kernels work on this rank's shards, raw and contiguous
/// (row-major), whose layouts the compiled program fixed: a kernel never redistributes, it
/// computes, and calls a collective only where the operation itself reduces over a split
/// dimension (the statistics of a norm, say), over the communicator `kernel_call::group`
/// gives.
///
/// Gradients follow xshard's convention (core/layout.hpp, `dual`): the cotangent of a value
/// laid out as L is laid out as dual(L) (its replicated axes pending sums, each rank holding
/// a term). A VJP is linear in the cotangents, so each rank applies it to its own terms; the
/// operand cotangents come out in the duals of the operands' layouts.

#include <xshard/compiled.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/graph/program.hpp>
#include <xshard/redistribute/cost_model.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace xshard {

/// The shape and type of an operand as a shape rule sees it.
struct operand_type {
    value_shape shape;
    dtype type = dtype::f64;
    bool is_weight = false;
};

/// A result's shape and type, as a shape rule gives it.
using result_spec = std::pair<value_shape, dtype>;

/// The layouts an operation runs with: one per operand (what it reads, after any
/// redistribution) and one per result (what it writes).
struct layout_choice {
    std::vector<layout> operands;
    std::vector<layout> results;
};

/// What a compiled operand or result is on this rank: its global shape, layout and local
/// shard shape.
struct shard_type {
    value_shape global;
    layout l;
    value_shape local;
    dtype type = dtype::f64;

    std::size_t rank() const { return global.size(); }
    /// The number of local elements.
    std::size_t count() const {
        std::size_t n = 1;
        for (auto e : local)
            n *= e;
        return n;
    }
};

/// The element-type-free description of an operation.
struct op_rules {
    std::string_view name;

    /// The results' shapes and types from the operands'; throws std::invalid_argument with a
    /// sentence when they do not fit (the caller names the node).
    std::vector<result_spec> (*infer)(const op_attributes&, std::span<const operand_type>) =
        nullptr;

    /// The layouts to run with, from the layouts asked of the operands (the node's strategy,
    /// or the data-parallel default): the operands' (adjusted where the operation needs, e.g.
    /// a dimension broadcast from extent 1 stays whole) and the results'. Throws
    /// std::invalid_argument with a sentence for layouts the operation cannot run with.
    layout_choice (*rule)(const op_attributes&, std::span<const operand_type>,
                          std::vector<layout> asked, const mesh_shape&) = nullptr;

    /// Whether operand `i`'s first dimension is a batch dimension, split over the dataset's
    /// axes when the node has no strategy (MindSpore's semi-auto default: data parallel).
    bool (*batched)(const op_attributes&, std::span<const operand_type>, std::size_t i) = nullptr;

    /// The operands' layouts from MindSpore strategies, one per operand: each resolved alone
    /// by default (core/strategy.hpp, `resolve`); an operation whose strategies share a device
    /// matrix (MatMul's ((a, b), (b, c))) resolves them together.
    std::vector<layout> (*resolve)(std::span<const strategy>, const mesh_shape&) = nullptr;

    /// Multiply-adds and other arithmetic per rank, for the report and the search.
    double (*flops)(const op_attributes&, std::span<const shard_type> operands,
                    std::span<const shard_type> results) = nullptr;

    /// The smallest of the m, n and k of the GEMMs the kernels run per rank (a convolution's
    /// im2col GEMM, or the one a direct convolution amounts to), which sets their speed
    /// (machine_model::gemm_seconds). None (the default): the arithmetic runs at the peak.
    double (*gemm_dimension)(const op_attributes&, std::span<const shard_type> operands,
                             std::span<const shard_type> results) = nullptr;

    /// How many times the forward kernel streams the operands and the results through
    /// memory, and the backward one (the VJP, which runs only where a cotangent reaches the
    /// node): the search prices their bytes times these at the machine's memory bandwidth. An
    /// elementwise operation reads and writes them once forward and about twice backward; one
    /// that takes statistics first streams them more often.
    double passes = 1;
    double backward_passes = 2;

    /// Transcendental functions (exp, log, erf, tanh) the forward kernel evaluates per element
    /// of the first operand, and the backward one (gelu: an erf forward, an erf and an exp
    /// backward). Vector exp and erf take far longer than their arithmetic suggests: the
    /// search prices each at the machine's `transcendental_seconds`. None by default.
    double transcendentals = 0;
    double backward_transcendentals = 0;

    /// Bytes the kernels stream in a training step beyond the operands and the results (a
    /// convolution's im2col columns): the search prices them at the memory bandwidth. None
    /// by default.
    double (*scratch_traffic)(const op_attributes&, std::span<const shard_type> operands,
                              std::span<const shard_type> results) = nullptr;

    /// Seconds of the messages the kernels themselves send in a training step (forward and
    /// backward), beyond the redistributions on the node's edges: a window's halo exchanges
    /// over a split height or width, batch norm's all-reduces of its statistics. None by
    /// default.
    double (*kernel_seconds)(const op_attributes&, std::span<const shard_type> operands,
                             std::span<const shard_type> results, const mesh_shape&,
                             const cost_model&) = nullptr;

    /// Which operands (bit i) and results (bit 16 + i) the VJP reads: what the forward pass
    /// keeps for the backward pass.
    std::uint32_t saves = 0;
    /// Whether the operation has a VJP (integer-valued operations and losses' labels have
    /// none for their integer operands).
    bool differentiable = true;
    /// Whether, without a strategy, the operation keeps its operands' layouts instead of the
    /// data-parallel default: the shape operations (MindSpore's Reshape follows its input).
    bool follows = false;
};

/// The user's own operation behind a custom-VJP node: its element-type-free half, the shape
/// and sharding rules (the kernels are the typed `custom_op`'s, graph/custom.hpp).
struct custom_op_base {
    virtual ~custom_op_base() = default;
    /// The results' shapes and types (throws std::invalid_argument as op_rules::infer).
    virtual std::vector<result_spec> infer(std::span<const operand_type> operands) const = 0;
    /// The layouts to run with (as op_rules::rule).
    virtual layout_choice rule(std::span<const operand_type> operands, std::vector<layout> asked,
                               const mesh_shape& mesh) const = 0;
    /// Whether operand `i`'s first dimension is a batch dimension (as op_rules::batched).
    virtual bool batched(std::span<const operand_type> operands, std::size_t i) const {
        return !operands[i].is_weight && !operands[i].shape.empty();
    }
};

/// The bit of `saves` for result `i`.
constexpr std::uint32_t saves_result(std::size_t i) { return std::uint32_t(1) << (16 + i); }
/// The bit of `saves` for operand `i`.
constexpr std::uint32_t saves_operand(std::size_t i) { return std::uint32_t(1) << i; }

/// What a kernel sees of the mesh: the shape, this rank's coordinates, and the
/// communicators of groups of axes (made once with the mesh).
struct mesh_view {
    mesh_shape shape;
    int rank = 0;
    mesh_coords coords;
    std::function<const communicator&(axis_set)> group;
};

/// One compiled operation as its kernels see it.
struct node_shards {
    const program_node* node = nullptr;
    std::vector<shard_type> operands;
    std::vector<shard_type> results;
    const mesh_view* mesh = nullptr;
    /// Per-node scratch that lives as long as the compiled program (argmax indices of a
    /// max-pool, the statistics of a norm): bytes, sized by `primitive::scratch_bytes`.
    mutable std::vector<std::byte> scratch;
    /// What a primitive prepares for the node at compile time and its kernels use at every run
    /// (`primitive::prepare`: a window's halo plan), or null.
    std::shared_ptr<void> state;
    /// Bytes this rank's forward kernel sends itself (a window's halos; `prepare` sets it),
    /// for the program's report.
    std::size_t kernel_bytes = 0;

    /// The communicator over the axes that split dimension `d` of operand `i`.
    const communicator& group_of_operand(std::size_t i, std::size_t d) const {
        return mesh->group(operands[i].l.split_axes(d, mesh->shape));
    }
    /// The block of operand `i` this rank holds (offsets into the global tensor).
    template <std::size_t N>
    box<N> operand_block(std::size_t i) const {
        std::array<std::size_t, N> g{};
        for (std::size_t d = 0; d < N; ++d)
            g[d] = operands[i].global[d];
        return block_of(operands[i].l, mesh->shape, g, mesh->coords);
    }
};

/// The pointers a forward kernel reads and writes (this rank's shards).
struct forward_args {
    const node_shards& shards;
    std::span<const void* const> operands;
    std::span<void* const> results;
};

/// The pointers a VJP reads and writes: the forward operands and results it saved (others
/// null), the results' cotangents (null for a result no loss depends on: zero), and the
/// operands' cotangents to write (null where none is wanted) or add to (`accumulate[i]`).
struct vjp_args {
    const node_shards& shards;
    std::span<const void* const> operands;
    std::span<const void* const> results;
    std::span<const void* const> result_cotangents;
    std::span<void* const> operand_cotangents;
    std::span<const bool> accumulate;
};

/// An operation with its kernels for element type T.
template <class T>
struct primitive {
    const op_rules* rules = nullptr;
    void (*forward)(const forward_args&) = nullptr;
    void (*vjp)(const vjp_args&) = nullptr;
    /// Bytes of scratch per node (see node_shards::scratch); none by default.
    std::size_t (*scratch_bytes)(const node_shards&) = nullptr;
    /// Builds the node's `state` once, when the program is compiled (none by default). It
    /// runs on every rank alike and sends no message; it throws xshard::error alike.
    void (*prepare)(node_shards&) = nullptr;
};

namespace detail {

/// Throws std::invalid_argument unless `n` operands came.
XSHARD_DECL void expect_operands(std::span<const operand_type> ops, std::size_t n,
                                 std::string_view what);

/// Throws std::invalid_argument unless operand `i` is floating.
XSHARD_DECL void expect_floating(std::span<const operand_type> ops, std::size_t i,
                                 std::string_view what);

/// The layout without pending sums (what every operation reads: partial results are
/// resolved on the edge before them).
XSHARD_DECL layout whole_terms(layout l);

/// The cotangent layout of a value laid out as `l`: its dual without sums over axes of one
/// rank.
XSHARD_DECL layout cotangent_layout(const layout& l, const mesh_shape& mesh);

/// Each operand resolved alone (`resolve` of core/strategy.hpp).
XSHARD_DECL std::vector<layout> resolve_each(std::span<const strategy> s, const mesh_shape& mesh);

} // namespace detail

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/graph/primitive.ipp>
#endif
