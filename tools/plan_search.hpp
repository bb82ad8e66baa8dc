// xshard-plan search: the strategy search (MindSpore's recursive_programming) as a dry run, in
// one process for any world size: the chosen strategy per operator, the predicted step time,
// memory and communication per rank, the runner-up and why it lost; optionally saved as an
// operator strategy file.
//
//   xshard-plan search --model mlp:784,512,512,10 --batch 64 --ranks 16384
//       [--memory-per-rank GiB] [--level 0|1|2] [--dtype f32] [--save strategy.json]
//   xshard-plan search --model transformer:layers,hidden,heads,seq,vocab --batch 8 --ranks 1024
//   xshard-plan search --program net.json --mesh dp=4,tp=2 [--propagate]
//       [--memory-per-rank GiB] [--save s.json]
//
// With --program, the search on programs (search/program_search.hpp) runs on a program file
// that xshard::save_program wrote (search/program_file.hpp), for the mesh given: every node's
// layouts, what they cost and the runner-up; --propagate keeps the file's annotations
// (sharding_propagation), --memory-per-rank caps the bytes per rank, and --save writes a
// program strategy file.
//
//   xshard-plan diff a.json b.json
//
// diff prints the nodes two program strategy files lay out differently (exit 1 when some do).
//
// Bad input gives one line on stderr and exit status 2.
#pragma once

#include <xshard/io/operator_strategy_file.hpp>
#include <xshard/search/networks.hpp>
#include <xshard/search/operator_strategy.hpp>
#include <xshard/search/program_file.hpp>
#include <xshard/search/program_search.hpp>
#include <xshard/search/program_strategy_file.hpp>
#include <xshard/search/recursive_programming.hpp>

#include "plan_cli.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace xshard_plan {

/// The comma-separated positive counts of `text` (for --model).
inline std::vector<std::size_t> counts_of(const std::string& text, const std::string& what) {
    std::vector<std::size_t> r;
    std::size_t start = 0;
    while (true) {
        const auto comma = text.find(',', start);
        const auto item = text.substr(start, comma == std::string::npos ? comma : comma - start);
        if (item.empty() || item.size() > 12 ||
            item.find_first_not_of("0123456789") != std::string::npos || std::stoull(item) == 0)
            throw usage_error("--model: '" + item + "' in " + what +
                                     " is not a positive count");
        r.push_back(std::stoull(item));
        if (comma == std::string::npos)
            return r;
        start = comma + 1;
    }
}

/// "mlp:784,512,10" or "transformer:layers,hidden,heads,seq,vocab".
inline xshard::network_spec parse_model(const std::string& text, std::size_t batch) {
    const auto colon = text.find(':');
    const std::string kind = text.substr(0, colon);
    if (colon == std::string::npos || (kind != "mlp" && kind != "transformer"))
        throw usage_error("--model: write mlp:in,hidden...,out or "
                                 "transformer:layers,hidden,heads,seq,vocab, not '" +
                                 text + "'");
    const auto n = counts_of(text.substr(colon + 1), kind);
    if (kind == "mlp") {
        if (n.size() < 2)
            throw usage_error("--model: an mlp needs at least two widths (in and out)");
        return xshard::mlp_network(n, batch);
    }
    if (n.size() != 5)
        throw usage_error("--model: a transformer takes layers,hidden,heads,seq,vocab "
                                 "(5 counts), not " +
                                 std::to_string(n.size()));
    return xshard::transformer_network(n[0], n[1], n[2], n[3], n[4], batch);
}

/// "tp=2e-6,8e-11": a mesh axis' alpha (s) and beta (s/B).
inline xshard::axis_link parse_axis_link(const std::string& text) {
    const auto eq = text.find('='), comma = text.find(',');
    if (eq == std::string::npos || comma == std::string::npos || comma < eq)
        throw usage_error("--axis-link: write axis=alpha,beta (seconds, seconds per byte), "
                                 "not '" +
                                 text + "'");
    const auto axis = text.substr(0, eq);
    if (axis != "dp" && axis != "tp")
        throw usage_error("--axis-link: the axes are dp and tp, not '" + axis + "'");
    try {
        std::size_t used = 0;
        const auto a = text.substr(eq + 1, comma - eq - 1), b = text.substr(comma + 1);
        const double alpha = std::stod(a, &used);
        if (used != a.size())
            throw std::invalid_argument(a);
        const double beta = std::stod(b, &used);
        if (used != b.size() || !(alpha >= 0) || !(beta >= 0))
            throw std::invalid_argument(b);
        return {xshard::axis_name(axis), {alpha, beta}};
    } catch (const std::invalid_argument&) {
        throw usage_error("--axis-link: '" + text + "' needs two non-negative numbers");
    }
}

/// The machine model of the options --gemm-flops, --gemm-half-dimension, --memory-bandwidth,
/// --transcendental-seconds and --axis-link.
inline xshard::machine_model machine_of(const CLI::App& app, double gemm, double half,
                                        double bandwidth, double functions,
                                        const std::vector<std::string>& links) {
    xshard::machine_model m;
    if (app.count("--gemm-flops")) {
        if (!(gemm > 0))
            throw usage_error("--gemm-flops must be positive");
        m.gemm_flops = gemm;
    }
    if (app.count("--gemm-half-dimension")) {
        if (!(half >= 0) || !std::isfinite(half))
            throw usage_error("--gemm-half-dimension must be a finite number, not negative");
        m.gemm_half_dimension = half;
    }
    if (app.count("--memory-bandwidth")) {
        if (!(bandwidth > 0))
            throw usage_error("--memory-bandwidth must be positive");
        m.memory_bandwidth = bandwidth;
    }
    if (app.count("--transcendental-seconds")) {
        if (!(functions > 0) || !std::isfinite(functions))
            throw usage_error("--transcendental-seconds must be a positive finite number");
        m.transcendental_seconds = functions;
    }
    for (const auto& l : links)
        m.links.axis_links.push_back(parse_axis_link(l));
    return m;
}

/// `xshard-plan search --program FILE --mesh ...`: the search on the program that FILE holds.
/// A search that finds nothing (no strategy within the memory cap, an annotation that cannot
/// run on the mesh) reports why and returns 1.
inline int search_program_file(const std::string& path, const std::string& mesh_text,
                               bool propagate, double memory_per_rank, const std::string& save,
                               const xshard::machine_model& machine) {
    if (mesh_text.empty())
        throw usage_error("--program needs --mesh (e.g. --mesh dp=4,tp=2)");
    xshard::mesh_shape mesh;
    try {
        mesh = xshard::mesh_shape::parse(mesh_text);
    } catch (const std::invalid_argument& e) {
        throw usage_error("--mesh: " + std::string(xshard::detail::without_prefix(e.what())));
    }
    const auto p = xshard::load_program(path);
    const auto start = std::chrono::steady_clock::now();
    xshard::program_strategy found;
    try {
        found = xshard::search_program(p, mesh,
                                       {.machine = machine,
                                        .keep_annotations = propagate,
                                        .memory_per_rank = memory_per_rank});
    } catch (const xshard::error& e) {
        report_failure(e);
        return 1;
    }
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fputs(found.explain().c_str(), stdout);
    std::printf("searched %zu nodes (%s) on mesh(%s), %d ranks, in %.3f s\n", found.nodes.size(),
                propagate ? "sharding_propagation" : "recursive_programming",
                mesh.to_string().c_str(), mesh.size(), took);
    if (!save.empty()) {
        xshard::save_program_strategy(save, found);
        std::printf("saved the program strategy file %s\n", save.c_str());
    }
    return 0;
}

/// `xshard-plan diff A B` (argv[0] is "diff"): each program strategy file's mesh and predicted
/// step, then the nodes the two lay out differently. Exits 0 when they lay every node out
/// alike, 1 when they differ (as diff does), 2 on bad input.
inline int plan_diff(int argc, char** argv) {
    CLI::App app{"xshard-plan diff: the nodes two program strategy files lay out differently"};
    std::string first, second;
    app.add_option("first", first, "a program strategy file (xshard-plan search --save)")
        ->required();
    app.add_option("second", second, "another")->required();
    if (const auto status = parse_arguments(app, argc, argv))
        return *status;
    try {
        const auto a = xshard::load_program_strategy(first);
        const auto b = xshard::load_program_strategy(second);
        for (const auto& [path, s] : {std::pair{&first, &a}, std::pair{&second, &b}})
            std::printf("%s: mesh(%s), %zu nodes, %s per step predicted\n", path->c_str(),
                        s->mesh.to_string().c_str(), s->nodes.size(),
                        xshard::program_strategy::seconds_text(s->seconds).c_str());
        if (!(a.mesh == b.mesh))
            std::printf("the meshes differ\n");
        const auto d = a.diff(b);
        std::fputs(d.c_str(), stdout);
        const auto lines = std::size_t(std::count(d.begin(), d.end(), '\n'));
        if (lines == 0) {
            std::printf("every node laid out alike\n");
            return 0;
        }
        std::printf("%zu node%s differ\n", lines, lines == 1 ? "" : "s");
        return 1;
    } catch (const std::exception& e) {
        return report_failure(e);
    }
}

/// `xshard-plan search ...` (argv[0] is "search"): returns the exit status.
inline int plan_search(int argc, char** argv) {
    CLI::App app{"xshard-plan search: the strategy search (recursive_programming), dry run"};
    std::string model, dtype = "f32", save, program_path, mesh_text;
    long long batch = 0, ranks = 0;
    bool propagate = false;
    double memory_gib = 0;
    int level = 2;
    double gemm = 0, half = 0, bandwidth = 0, functions = 0;
    std::vector<std::string> links;
    auto* model_option = app.add_option(
        "--model", model, "mlp:784,512,512,10 or transformer:layers,hidden,heads,seq,vocab");
    auto* program_option = app.add_option(
        "--program", program_path, "a program file (xshard::save_program) to search instead");
    model_option->excludes(program_option);
    app.add_option("--mesh", mesh_text, "with --program: the mesh, dp=4,tp=2")
        ->needs(program_option);
    app.add_flag("--propagate", propagate,
                 "with --program: keep its annotations and search the rest (sharding_propagation)")
        ->needs(program_option);
    app.add_option("--batch", batch, "samples per step")->needs(model_option);
    app.add_option("--ranks", ranks, "world size")->needs(model_option);
    // A program file has its own element types, and its search minimises the predicted step:
    // --level and --dtype are --model's alone.
    app.add_option("--memory-per-rank", memory_gib, "memory cap per rank, GiB (none if not given)");
    app.add_option("--level", level, "objective: 0 least communication, 1 least memory, 2 fastest")
        ->excludes(program_option);
    app.add_option("--dtype", dtype, "element type: f16 bf16 f32 f64")->excludes(program_option);
    app.add_option("--gemm-half-dimension", half,
                   "the smallest GEMM dimension that runs at half that speed (measure_machine's)");
    app.add_option("--gemm-flops", gemm, "GEMM speed per rank, FLOP/s (measure_machine's)");
    app.add_option("--memory-bandwidth", bandwidth,
                   "elementwise work per rank, bytes/s read and written (measure_machine's)");
    app.add_option("--transcendental-seconds", functions,
                   "seconds of an exp or erf per element (measure_machine's)");
    app.add_option("--axis-link", links, "a mesh axis' link: axis=alpha,beta (repeatable)");
    app.add_option("--save", save, "write the chosen strategies as an operator strategy file");
    if (const auto status = parse_arguments(app, argc, argv))
        return *status;
    try {
        if (app.count("--memory-per-rank") && !(memory_gib > 0))
            throw usage_error("--memory-per-rank must be a positive number of GiB");
        const double memory_per_rank = app.count("--memory-per-rank")
                                           ? memory_gib * double(1ULL << 30)
                                           : std::numeric_limits<double>::infinity();
        if (!program_path.empty())
            return search_program_file(program_path, mesh_text, propagate, memory_per_rank, save,
                                       machine_of(app, gemm, half, bandwidth, functions, links));
        if (model.empty())
            throw usage_error("give --model (with --batch and --ranks) or --program (with --mesh)");
        for (const char* needed : {"--batch", "--ranks"})
            if (!app.count(needed))
                throw usage_error(std::string(needed) + " is required with --model");
        if (batch < 1)
            throw usage_error("--batch must be at least 1");
        if (ranks < 1 || ranks > (1LL << 30))
            throw usage_error("--ranks must be in [1, 2^30]");
        if (!xshard::is_objective_level(level))
            throw usage_error(xshard::bad_objective_level("--level", level));
        xshard::search_options o;
        o.ranks = int(ranks);
        o.level = level;
        o.memory_per_rank = memory_per_rank;
        if (dtype == "f16" || dtype == "bf16")
            o.machine.element = 2;
        else if (dtype == "f32")
            o.machine.element = 4;
        else if (dtype == "f64")
            o.machine.element = 8;
        else
            throw usage_error("--dtype must be f16, bf16, f32 or f64, not '" + dtype + "'");
        const auto element = o.machine.element;
        o.machine = machine_of(app, gemm, half, bandwidth, functions, links);
        o.machine.element = element;
        const auto net = parse_model(model, std::size_t(batch));
        const auto start = std::chrono::steady_clock::now();
        const auto r = xshard::search_strategy(net, o);
        const double took =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fputs(xshard::describe(r, net).c_str(), stdout);
        std::printf("searched %zu candidates on %lld ranks in %.3f s\n", r.candidates, ranks, took);
        if (!save.empty()) {
            if (!r.best)
                throw usage_error("nothing to save: no strategy fits the memory cap");
            xshard::save_operator_strategy(save, xshard::make_operator_strategy(net, *r.best));
            std::printf("saved the operator strategy file %s\n", save.c_str());
        }
        return r.best ? 0 : 1;
    } catch (const std::exception& e) {
        return report_failure(e);
    }
}

} // namespace xshard_plan
