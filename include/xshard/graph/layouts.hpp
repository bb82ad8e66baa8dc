#pragma once
/// \file
/// The layouts of a program on a mesh, MindSpore's semi-auto pass: every node runs with the
/// layouts its strategy gives (annotated nodes keep theirs) or, without one, data parallel
/// (the batch dimension split over the dataset's axes, weights replicated; the shape
/// operations keep their operand's layout instead, as MindSpore's Reshape does); its
/// primitive's sharding rule turns those into the operands' and results' layouts. Inputs come in
/// the dataset's layout (data parallel by default); a weight takes the layout of its first use, or
/// the one `layout_options::weight_layouts` plans for it.
///
/// Every mismatch between where a value is and where a node reads it becomes a
/// redistribution on that edge (graph/schedule.hpp plans them). Misuse raises
/// xshard::error with one sentence naming the node: a strategy that does not fit the mesh,
/// a layout naming an unknown axis.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/sharded_layout.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/graph/primitive.hpp>
#include <xshard/graph/program.hpp>
#include <xshard/graph/registry.hpp>

#include <cstddef>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace xshard {

/// How a program is laid out on a mesh beyond its own annotations.
struct layout_options {
    /// The mesh axes the batch is split over by default (MindSpore's dataset_strategy:
    /// data parallel over every axis); empty: every axis of the mesh.
    std::vector<std::string> dataset_axes = {};
    /// Input name -> its layout, overriding the dataset's split (MindSpore's dataset_strategy
    /// as layouts; "full batch" is the replicated layout).
    std::map<std::string, layout> input_layouts = {};
    /// Weight name -> its layout (MindSpore's parameter_plan, and the layouts a parameter
    /// strategy file gives): the weight is kept so, and a node without an annotation reads it
    /// so, its rule deriving the rest (an annotated node reads the weight as annotated, moved
    /// from the kept layout).
    std::map<std::string, layout> weight_layouts = {};
    /// hsdp level 3 for a program (ZeRO-3, FSDP's full sharding): each weight is kept split
    /// over these mesh axes too (those its layout does not use yet; core/sharded_layout.hpp's
    /// rule picks the dimension), so each rank stores, updates and keeps optimizer state for
    /// its share. The schedule gathers a weight just before each use and again before its
    /// VJP, and the adjoint of the gather reduce-scatters its gradient.
    std::vector<std::string> weight_shard_axes = {};
    /// Weights of fewer global bytes (shape x element size) than this are not split over
    /// weight_shard_axes (hsdp's threshold).
    std::size_t weight_shard_min_bytes = 0;
};

/// Where every value of a program lives on a mesh and how every node runs.
struct program_layouts {
    /// Per node: the operands' layouts as it reads them and the results' as it writes them.
    std::vector<layout_choice> nodes;
    /// Per value: the layout it is kept in (inputs and weights as bound, results after any
    /// out-layout annotation).
    std::vector<layout> values;
};

namespace detail {

/// The data-parallel layout of a rank-r operand: dimension 0 over `axes`.
XSHARD_DECL layout batch_layout(std::size_t r, const dim_axes& axes);

XSHARD_DECL dim_axes dataset_axes_of(const layout_options& o, const mesh_shape& mesh);

/// Each weight's layout with the asked axes it does not use added (hsdp level 3; see
/// layout_options::weight_shard_axes). Axes of one rank add nothing.
XSHARD_DECL void shard_weights(const program& p, const mesh_shape& mesh,
                               const std::vector<std::string>& names, std::size_t min_bytes,
                               std::vector<layout>& values);

/// The layouts a node asks of its operands: its annotation's, the operands' own (shape
/// operations), or data parallel.
XSHARD_DECL std::vector<layout> asked_layouts(const program_node& n, const op_rules* rules,
                                              std::span<const operand_type> types,
                                              const dim_axes& dataset, const mesh_shape& mesh,
                                              const std::vector<layout>& kept);

XSHARD_DECL void check_fits(const layout& l, std::size_t rank, const mesh_shape& mesh,
                            const std::string& what);

/// Places the weights `options.weight_layouts` plans into `kept`; returns which values they
/// are. Raises naming a name that is not a weight of `p`, or a layout that does not fit.
XSHARD_DECL std::vector<bool> place_planned_weights(const program& p, const mesh_shape& mesh,
                                                    const layout_options& options,
                                                    std::vector<layout>& kept);

} // namespace detail

/// Lays `p` out on `mesh` (see the file comment). Every rank computes the same layouts from
/// the same program, so misuse raises on every rank alike.
XSHARD_DECL program_layouts assign_layouts(const program& p, const mesh_shape& mesh,
                                           const layout_options& options = {});

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/graph/layouts.ipp>
#endif
