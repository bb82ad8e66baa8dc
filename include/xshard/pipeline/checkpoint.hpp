#pragma once
/// \file
/// Checkpoints and strategy files of a pipeline, per stage (as MindSpore saves each stage's
/// parameters with its own strategy): in a directory, each pipeline rank's stage writes its
/// modules' parameters into `stage_<r>.safetensors` (an integrated checkpoint of that stage,
/// io/checkpoint.hpp: written by the stage's ranks only, every stage at once) and their
/// strategy into `stage_<r>.strategy.json` (each parameter's layout on the stage's mesh, and
/// the pipeline's stage count); `stages.json` maps each module to its file. Loading reads
/// the stage files into any strategy (io/checkpoint.hpp's load-into-any-strategy, file by
/// file): a model on one mesh (no pipeline), or a pipeline with another cut, another number
/// of stages or other stage meshes, each rank loading the modules it holds from the files
/// that hold them. The other way, a checkpoint of a model on one mesh (save_checkpoint)
/// loads into a pipeline through `load_checkpoint(path, pipe.local_parameters())`.

#include <xshard/comm/agree.hpp>
#include <xshard/io/checkpoint.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/strategy_file.hpp>
#include <xshard/pipeline/pipeline.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace xshard::pipeline {

namespace detail {

inline std::string stage_file(const std::string& dir, int r) {
    return dir + "/stage_" + std::to_string(r) + ".safetensors";
}

/// Module name -> file index, from `dir/stages.json`.
inline std::map<std::string, int> read_stage_index(const std::string& dir) {
    const auto j = nlohmann::json::parse(xshard::detail::read_file(dir + "/stages.json"));
    std::map<std::string, int> out;
    for (const auto& [name, file] : j.at("modules").items())
        out[name] = file.get<int>();
    return out;
}

/// Loads, file by file, the modules of `model` named in `holds` from the stage files of
/// `dir` (index `index`): a stage_view per file, collective over the mesh of its tensors.
template <class Model>
void load_files(const std::string& dir, const std::map<std::string, int>& index, Model& model,
                const std::set<std::string>& holds) {
    std::map<int, std::set<std::string>> per_file;
    for (const auto& [name, file] : index)
        if (holds.count(name))
            per_file[file].insert(name);
    for (auto& [file, names] : per_file) {
        stage_view<Model> view{&model, &names};
        bool any = false;
        for_each_parameter(view, [&](const std::string&, const auto&) { any = true; });
        if (any)
            load_checkpoint(stage_file(dir, file), view);
    }
}

} // namespace detail

/// Saves the pipeline's parameters, stage by stage, into directory `dir` (see the file
/// comment; created if needed), with `step` recorded. Collective over the pipeline's mesh:
/// each stage's checkpoint is collective over its stage mesh, and a failure anywhere raises
/// `io_error` on every rank.
template <class Model, distributed_tensor X>
void save_stage_checkpoints(pipeline<Model, X>& pipe, const std::string& dir,
                            std::int64_t step = 0) {
    const auto& world = pipe.comm();
    std::optional<std::string> problem;
    if (world.rank() == 0) {
        try {
            std::filesystem::create_directories(dir);
            nlohmann::json j;
            j["files"] = pipe.config().stages;
            for (const auto& [name, stage] : pipe.stages())
                j["modules"][name] = pipe.config().rank_of_stage(stage);
            xshard::detail::write_file_atomically(dir + "/stages.json", j.dump(1));
        } catch (const std::exception& e) {
            problem =
                "xshard: pipeline checkpoint: cannot write " + dir + "/stages.json: " + e.what();
        }
    }
    agree_on_error<io_error>(world, problem);
    try {
        const int r = pipe.stage();
        save_checkpoint(detail::stage_file(dir, r), pipe.local_parameters(), {.step = step});
        save_strategy_file(dir + "/stage_" + std::to_string(r) + ".strategy.json",
                           pipe.local_parameters(), false, pipe.config().stages);
    } catch (const std::exception& e) {
        problem = e.what();
    }
    agree_on_error<io_error>(world, problem);
}

/// Loads the stage checkpoints of `dir` into `model`, a model on one mesh (not pipelined):
/// every rank reads every stage file. Collective over the model's mesh; throws io_error on
/// every rank, changing nothing of the file it failed on, when a file is missing, damaged or
/// does not match the model.
template <class Model>
void load_stage_checkpoints(const std::string& dir, Model& model) {
    const communicator* comm = nullptr;
    for_each_parameter(model, [&](const std::string&, const auto& t) { comm = &t.mesh().comm(); });
    if (!comm)
        throw error("xshard: pipeline checkpoint: the model has no parameters to load");
    std::map<std::string, int> index;
    xshard::detail::everywhere(*comm, [&] { index = detail::read_stage_index(dir); });
    std::set<std::string> all;
    visit_parameters(model, [&](std::string_view name, auto&) { all.insert(std::string(name)); });
    detail::load_files(dir, index, model, all);
}

/// Loads the stage checkpoints of `dir` into a pipeline of any cut, stage count and stage
/// meshes: each rank the modules it runs, from the files that hold them. Collective over
/// the pipeline's mesh; a failure anywhere raises `io_error` on every rank.
template <class Model, distributed_tensor X>
void load_stage_checkpoints(const std::string& dir, pipeline<Model, X>& pipe) {
    std::map<std::string, int> index;
    xshard::detail::everywhere(pipe.comm(), [&] { index = detail::read_stage_index(dir); });
    std::optional<std::string> problem;
    try {
        detail::load_files(dir, index, pipe.model(), pipe.local_modules());
    } catch (const std::exception& e) {
        problem = e.what();
    }
    agree_on_error<io_error>(pipe.comm(), problem);
}

} // namespace xshard::pipeline
