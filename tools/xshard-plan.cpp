// xshard-plan: prints the redistribution plan between two layouts, for a mesh, a global
// shape and an element type, with its predicted cost; on meshes of any size (no MPI run
// needed: the plan is priced for one rank from the shapes alone).
//
//   xshard-plan --mesh dp=2,mp=4 --shape 4096,4096 --dtype f32 --from "[(dp,mp),-]" --to "[-,mp]"
//   xshard-plan --mesh dp=auto,mp=8 --ranks 16384 --shape 65536,8192 --from "[dp,mp]" --to "[mp,-]"
//   xshard-plan pipeline --stages 4 --micro-batches 8 --schedule 1f1b   (plan_pipeline.hpp)
//   xshard-plan search --model mlp:784,512,512,10 --batch 64 --ranks 16384   (plan_search.hpp)
//   xshard-plan diff a.json b.json   (two program strategy files; plan_search.hpp)
//
// Bad input gives one line on stderr and exit status 2.

#include <xshard/core/volume.hpp>
#include <xshard/redistribute/geometry.hpp>
#include <xshard/redistribute/planner.hpp>
#include <xshard/redistribute/route.hpp>

#include "plan_cli.hpp"

#include "plan_pipeline.hpp"
#include "plan_search.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using xshard_plan::usage_error;

std::vector<std::string> split(const std::string& text) {
    std::vector<std::string> items;
    std::size_t start = 0;
    for (auto comma = text.find(',');; comma = text.find(',', start)) {
        items.push_back(text.substr(start, comma == std::string::npos ? comma : comma - start));
        if (comma == std::string::npos)
            return items;
        start = comma + 1;
    }
}

std::size_t parse_count(const std::string& text, const char* option) {
    if (text.empty() || text.size() > 12 ||
        text.find_first_not_of("0123456789") != std::string::npos)
        throw usage_error(std::string(option) + ": '" + text + "' is not a count");
    return std::stoull(text);
}

/// "dp=2,mp=auto" with --ranks N: the mesh shape (at most one size "auto").
xshard::mesh_shape parse_mesh(const std::string& text, int ranks) {
    xshard::static_vector<xshard::axis_name, xshard::max_mesh_axes> names;
    xshard::static_vector<int, xshard::max_mesh_axes> sizes;
    for (const auto& item : split(text)) {
        const auto eq = item.find('=');
        if (eq == std::string::npos)
            throw usage_error("--mesh: write name=size,name=size (a size may be 'auto')");
        if (names.size() == xshard::max_mesh_axes)
            throw usage_error("--mesh: a mesh has at most 6 axes");
        names.push_back(xshard::axis_name(item.substr(0, eq)));
        const auto size = item.substr(eq + 1);
        if (size == "auto") {
            sizes.push_back(xshard::auto_size);
            continue;
        }
        const auto n = parse_count(size, "--mesh");
        if (n < 1 || n > std::size_t(INT_MAX))
            throw usage_error("--mesh: the size of axis '" + item.substr(0, eq) +
                              "' must be between 1 and " + std::to_string(INT_MAX));
        sizes.push_back(int(n));
    }
    std::size_t product = 1;
    for (auto s : sizes)
        if (s != xshard::auto_size)
            product = xshard::checked_mul(product, std::size_t(s), "the mesh's size");
    if (product > std::size_t(INT_MAX))
        throw usage_error("--mesh: a mesh of " + std::to_string(product) + " ranks (at most " +
                          std::to_string(INT_MAX) + ")");
    if (ranks == 0) {
        if (sizes.contains(xshard::auto_size))
            throw usage_error("--mesh: an 'auto' size needs --ranks");
        return xshard::mesh_shape(names, sizes);
    }
    return xshard::mesh_shape::fit(names, sizes, ranks);
}

std::vector<std::size_t> parse_shape(const std::string& text) {
    std::vector<std::size_t> shape;
    for (const auto& item : split(text))
        shape.push_back(parse_count(item, "--shape"));
    if (shape.size() > xshard::max_tensor_rank)
        throw usage_error("--shape: at most 8 dimensions");
    return shape;
}

std::size_t element_size(const std::string& dtype) {
    static const std::map<std::string, std::size_t> sizes{
        {"f16", 2}, {"bf16", 2}, {"f32", 4}, {"f64", 8}, {"i8", 1},  {"u8", 1},   {"i16", 2},
        {"i32", 4}, {"i64", 8},  {"u32", 4}, {"u64", 8}, {"c64", 8}, {"c128", 16}};
    const auto it = sizes.find(dtype);
    if (it == sizes.end())
        throw usage_error("--dtype: one of f16, bf16, f32, f64, i8, u8, i16, i32, i64, u32, u64, "
                          "c64, c128");
    return it->second;
}

std::string mib(std::size_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f MiB", double(bytes) / double(1 << 20));
    return buf;
}

template <std::size_t N>
int print_plan(const xshard::mesh_shape& mesh, const std::vector<std::size_t>& extents,
               std::size_t element, const xshard::layout& from, const xshard::layout& to,
               int rank) {
    std::array<std::size_t, N> shape{};
    for (std::size_t d = 0; d < N; ++d)
        shape[d] = extents[d];
    const std::size_t total =
        xshard::checked_mul(xshard::volume(extents), element, "the tensor's size in bytes");
    const xshard::cost_model model{};
    // The candidates a plan weighs (without the mesh's axes of size 1), and what it runs: a
    // candidate, or a cheaper route through intermediate layouts.
    const auto candidates = xshard::candidates_on(mesh, from, to);
    const auto route = xshard::choose_route(candidates, mesh, shape, element, model);
    const auto chosen =
        std::size_t(std::find(candidates.paths.begin(), candidates.paths.end(), route.steps) -
                    candidates.paths.begin());
    std::printf("mesh(%s), %d ranks; global shape %s, %s; plan for rank %d\n",
                mesh.to_string().c_str(), mesh.size(), xshard::detail::shape_string(shape).c_str(),
                mib(total).c_str(), rank);
    std::printf("from %s to %s\n", from.to_string().c_str(), to.to_string().c_str());
    std::string unit;
    for (std::size_t a = 0; a < mesh.ndim(); ++a)
        if (mesh.sizes[a] == 1)
            unit += (unit.empty() ? "" : ", ") + std::string(mesh.names[a].view());
    if (!unit.empty())
        std::printf("axes of size 1 take no part: %s\n", unit.c_str());
    if (chosen == candidates.paths.size()) {
        const auto s = xshard::summarize(route.steps, mesh, shape, element, rank, model);
        std::printf("\nthrough intermediate layouts (cheaper than every candidate):\n%s",
                    xshard::describe(s, mesh).c_str());
    }
    for (std::size_t i = 0; i < candidates.paths.size(); ++i) {
        const auto s = xshard::summarize(candidates.paths[i], mesh, shape, element, rank, model);
        if (i == chosen) {
            std::printf("\n%s", xshard::describe(s, mesh).c_str());
        } else {
            std::printf(
                "\nalternative (not chosen%s): %zu steps, predicted %.1f us, peak extra %s\n",
                s.valid ? "" : ": its pieces do not tile for these extents", s.steps.size(),
                s.seconds * 1e6, mib(s.peak_extra_bytes).c_str());
        }
    }
    return 0;
}

template <std::size_t... I>
int dispatch(std::size_t n, std::index_sequence<I...>, auto&&... args) {
    int rc = 0;
    (void)((n == I ? (rc = print_plan<I>(args...), true) : false) || ...);
    return rc;
}

} // namespace

int main(int argc, char** argv) {
    if (argc > 1 && std::string(argv[1]) == "pipeline")
        return xshard_plan::plan_pipeline(argc - 1, argv + 1);
    if (argc > 1 && std::string(argv[1]) == "search")
        return xshard_plan::plan_search(argc - 1, argv + 1);
    if (argc > 1 && std::string(argv[1]) == "diff")
        return xshard_plan::plan_diff(argc - 1, argv + 1);
    CLI::App app{"xshard-plan: the redistribution plan between two layouts, with its cost"};
    std::string mesh_text, shape_text, dtype = "f64", from_text, to_text;
    int ranks = 0, rank = 0;
    app.add_option("--mesh", mesh_text,
                   "mesh axes and sizes, e.g. dp=2,mp=4 (one size may be auto)")
        ->required();
    app.add_option("--shape", shape_text, "global shape, e.g. 4096,4096")->required();
    app.add_option("--dtype", dtype,
                   "element type: f16 bf16 f32 f64 i8 u8 i16 i32 i64 u32 u64 c64 c128");
    app.add_option("--from", from_text, "source layout, e.g. \"[(dp,mp), -]\"")->required();
    app.add_option("--to", to_text, "destination layout, e.g. \"[-, mp]\"")->required();
    app.add_option("--ranks", ranks,
                   "number of ranks (fills an 'auto' mesh size; must match the mesh)");
    app.add_option("--rank", rank, "the rank whose part is printed (default 0)");
    if (const auto status = xshard_plan::parse_arguments(app, argc, argv))
        return *status;
    try {
        if (ranks < 0)
            throw usage_error("--ranks must be positive");
        const auto mesh = parse_mesh(mesh_text, ranks);
        const auto shape = parse_shape(shape_text);
        const auto element = element_size(dtype);
        xshard::checked_mul(xshard::volume(shape), element, "--shape: the tensor's size in bytes");
        const auto from = xshard::layout::parse(from_text);
        const auto to = xshard::layout::parse(to_text);
        from.validate(mesh);
        to.validate(mesh);
        if (from.rank() != shape.size() || to.rank() != shape.size())
            throw usage_error("the layouts must have one entry per dimension of --shape (" +
                              std::to_string(shape.size()) + ")");
        if (rank < 0 || rank >= mesh.size())
            throw usage_error("--rank must be a rank of the mesh");
        return dispatch(shape.size(), std::make_index_sequence<xshard::max_tensor_rank + 1>{}, mesh,
                        shape, element, from, to, rank);
    } catch (const std::exception& e) {
        return xshard_plan::report_failure(e);
    }
}
