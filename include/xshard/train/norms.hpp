#pragma once
/// \file
/// Gradient norms: each rank's local norms, the global norm of a whole model, clipping by
/// it, and printing or dumping the local norms (MindSpore's print_local_norm /
/// dump_local_norm).
///
/// The global norm counts every element of the model once, whatever its layout: a rank adds
/// the squares of its shard divided by the number of ranks holding the same block (the
/// parameter's replicated axes), and one all-reduce of a double over the mesh sums them. So
/// a replicated parameter is not counted twice and a sharded one is summed over its shards.
/// A partial tensor (pending sum) has no norm until it is reduced: that is an error.

#include <xshard/comm/collectives.hpp>
#include <xshard/comm/environment.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/param/traversal.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace xshard {

/// The norm of each tensor's local shard on this rank (no communication).
template <parameter_container G>
std::map<std::string, double> local_norms(const G& grads) {
    std::map<std::string, double> norms;
    for_each_parameter(grads, [&](const std::string& name, const auto& t) {
        double s = 0;
        for (const auto& x : t.local())
            s += double(x) * double(x);
        norms[name] = std::sqrt(s);
    });
    return norms;
}

/// The norm of all of `grads` together, each element counted once (see the file comment).
/// Collective over the tensors' mesh (the largest, when some live on meshes of a part of its
/// ranks, copies of one another that tile it): one all-reduce of a double.
template <parameter_container G>
double global_norm(const G& grads) {
    // (contribution, ranks of its mesh): a tensor on a mesh of fewer ranks than the largest
    // (optimizer sharding over part of an axis keeps its state on the mesh of one copy of
    // those ranks, train/hsdp.hpp) is held alike by each copy of that mesh.
    std::vector<std::pair<double, int>> parts;
    const communicator* comm = nullptr;
    for_each_parameter(grads, [&](const std::string& name, const auto& t) {
        if (t.layout().is_partial())
            throw error("xshard: global_norm: '" + name + "' is partial " + t.layout().to_string() +
                        "; reduce it first (a weight's gradient holds each rank's term of a "
                        "pending sum until synchronize_gradients)");
        double s = 0;
        for (const auto& x : t.local())
            s += double(x) * double(x);
        const auto& ms = t.mesh().shape();
        parts.emplace_back(s / double(ms.group_size(t.layout().replicated_axes(ms))),
                           t.mesh().size());
        if (!comm || t.mesh().size() > comm->size())
            comm = &t.mesh().comm();
    });
    double sum = 0;
    for (const auto& [s, ranks] : parts)
        sum += s / double(comm->size() / ranks);
    if (comm)
        allreduce(*comm, std::span(&sum, 1), reduction::sum);
    return std::sqrt(sum);
}

/// Scales `grads` by max_norm / norm when their global norm exceeds `max_norm`; returns the
/// norm before clipping. Collective (see global_norm).
template <parameter_container G>
double clip_by_global_norm(G& grads, double max_norm) {
    const double norm = global_norm(grads);
    if (norm > max_norm) {
        const double scale = max_norm / norm;
        for_each_parameter(grads, [&](const std::string&, auto& t) {
            using T = typename std::remove_cvref_t<decltype(t)>::value_type;
            for (auto& x : t.local())
                x = T(double(x) * scale);
        });
    }
    return norm;
}

/// Prints this rank's local norms, one line each: "rank R <name> <norm>".
template <parameter_container G>
void print_local_norm(const G& grads, std::ostream& out) {
    const int rank = environment::world_rank();
    char line[64];
    for (const auto& [name, norm] : local_norms(grads)) {
        std::snprintf(line, sizeof line, " %.9g\n", norm);
        out << "rank " << rank << ' ' << name << line;
    }
}

/// Appends this rank's local norms of `step` to `<directory>/local_norm_rank<R>.txt` (one
/// file per rank, one line per tensor: "<step> <name> <norm>"). The directory must exist.
template <parameter_container G>
void dump_local_norm(const G& grads, const std::string& directory, long step) {
    const int rank = environment::world_rank();
    const std::string path = directory + "/local_norm_rank" + std::to_string(rank) + ".txt";
    std::ofstream file(path, std::ios::app);
    if (!file)
        throw error("xshard: dump_local_norm: cannot open " + path);
    char line[64];
    for (const auto& [name, norm] : local_norms(grads)) {
        std::snprintf(line, sizeof line, " %.9g\n", norm);
        file << step << ' ' << name << line;
    }
}

} // namespace xshard
