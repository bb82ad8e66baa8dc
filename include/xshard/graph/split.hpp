#pragma once
/// \file
/// A program cut into modules at its top-level scopes: the nodes named "block0.*" (or the one
/// node named "block0") make module "block0", in the program's order, and each module is a
/// program of its own whose one input is what the module before it passes on. This is how a
/// program becomes a chain of layers (graph/program_chain.hpp) that a pipeline cuts into
/// stages.
///
/// A module's program keeps the nodes' names and the weights' full names and initializers,
/// so its weights are drawn with the values the whole program's would have. A cut carries
/// what is made before it and read after it: the program's input enters the first module,
/// and the last module gives the program's one output. One tensor crosses a cut as it is.
/// Several (a skip connection across the cut, a residual that a later module adds) are packed
/// into one: each tensor's rows flattened, the tensors side by side ("concat" of the module
/// before, node "<module>.cut_out.concat"), and sliced apart and reshaped back in the module
/// after ("<module>.cut_in.slice_<k>"). So a pipeline still passes one tensor between
/// stages, split into micro-batches by its rows. What does not fit raises xshard::error
/// naming the modules and values: tensors of other rows or element types at one cut, a weight
/// used by two modules, a scope whose nodes are not consecutive.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/graph/program.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace xshard {

/// One module of a cut program: its name (the top-level scope) and its program.
struct program_module {
    std::string name;
    program body;
};

namespace detail {

/// The top-level scope of a node's name: "block0" for "block0.fc.matmul" and for "block0".
inline std::string top_scope(const std::string& name) {
    return name.substr(0, name.find('.'));
}

/// "a, b, c" of the values' display names.
XSHARD_DECL std::string value_names(const program& p, const std::set<std::size_t>& ids);

/// The elements of one row (dimension 0) of a tensor of shape `s`.
inline std::size_t row_width(const value_shape& s) {
    return volume(std::span(s).subspan(1));
}

/// A node of operation `op` named `name`, with integer attributes `ints`, reading `operands`.
XSHARD_DECL program_node cut_node(std::string op, std::string name, std::vector<std::int64_t> ints,
                                  std::vector<std::size_t> operands);

/// The nodes that unpack a cut's packed tensor `packed` (a value of `out`) into the values
/// `carried` of `p`: each its columns of the packed rows, reshaped back to its shape. Their
/// ids in `out` go into `id`.
XSHARD_DECL void unpack_cut(const program& p, program& out, const std::string& module,
                            std::size_t packed, const std::vector<std::size_t>& carried,
                            std::map<std::size_t, std::size_t>& id);

/// The node that packs `values` (of `out`) into one tensor of rank `rank`: each value's rows
/// flattened, the values side by side ([rows, width0 + width1 + ..., 1, ...]). Returns its id.
XSHARD_DECL std::size_t pack_cut(program& out, const std::string& module,
                                 const std::vector<std::size_t>& values, std::size_t rank);

/// The module's program: nodes [first, last) of `p` reading `inputs` (values of `p`), with
/// `outputs` its outputs. One value crosses a cut as it is; several are packed into one
/// tensor of rank `rank` (pack_cut) and unpacked on the other side (unpack_cut).
XSHARD_DECL program module_program(const program& p, const std::string& module, std::size_t first,
                                   std::size_t last, const std::vector<std::size_t>& inputs,
                                   const std::vector<std::size_t>& outputs, std::size_t rank);

} // namespace detail

/// `p` cut into its modules (see the file comment). `p` has one input and one output.
XSHARD_DECL std::vector<program_module> split_modules(const program& p);

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/graph/split.ipp>
#endif
