#pragma once
/// \file
/// This rank's part of a pipelined model as a parameter container: the modules of the
/// stages the rank runs, named as in the model, for the optimizers, norms, gradient
/// synchronisation and checkpoints of the stage.

#include <xshard/param/traversal.hpp>

#include <set>
#include <string>
#include <string_view>

namespace xshard::pipeline::detail {

/// The modules of `*model` whose names are in `*local` (see the file comment).
template <class Model>
struct stage_view {
    Model* model;
    const std::set<std::string>* local;
    friend void visit_parameters(stage_view& v, auto&& visit) {
        visit_parameters(*v.model, [&](std::string_view name, auto& child) {
            if (v.local->count(std::string(name)))
                visit(name, child);
        });
    }
    friend void visit_parameters(const stage_view& v, auto&& visit) {
        visit_parameters(*v.model, [&](std::string_view name, auto& child) {
            if (v.local->count(std::string(name)))
                visit(name, child);
        });
    }
};

} // namespace xshard::pipeline::detail
