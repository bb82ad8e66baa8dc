#pragma once
/// \file
/// MindSpore's `AutoParallel(network, parallel_mode)`: one object that configures parallel
/// training of a model on a mesh, and hands each mechanism its configured piece:
///
///     xshard::auto_parallel net(model, mesh);            // parallel_mode semi_auto
///     net.hsdp();                                         // optimizer sharding, level1
///     net.dataset_strategy("data_parallel");
///     net.enable_gradients_mean();
///     net.save_param_strategy_file("/tmp/param.json");
///     net.compile();                                      // checks, writes the files
///     auto sharding = net.make_hsdp();                    // xshard::hsdp with the options
///     ... sharding->synchronize_gradients(); sharding->step(optimizer);
///
/// Without hsdp a loop synchronises with `xshard::synchronize_gradients(model, grads,
/// net.gradient_options())`. Every setter validates its value against MindSpore's documented
/// conditions and agrees on the outcome over the mesh (one all-reduce of an int), so an
/// invalid value raises `xshard::error` on every rank. Settings whose mechanism xshard lacks
/// are recorded, and `compile()` (the use) raises "not supported yet"
/// for them: interleave with another scheduler than 1f1b. Parallel modes
/// sharding_propagation and recursive_programming run their engines in `compile()`: on a
/// compiled program (graph/executable.hpp) the search on programs
/// (search/program_search.hpp), which then compiles the program again with the layouts
/// found; on a program chain (graph/program_chain.hpp) the same search of its whole program
/// on the chain's mesh (a pipeline's stage mesh), each module then compiled again. On any
/// other model they raise.
/// A parameter strategy file lays a compiled program's or a program chain's weights out by
/// compiling it again with the file's layouts.
/// A dataset strategy of layouts or strategies lays a compiled program's inputs out, in
/// order: `compile()` compiles it again with them (its weights keeping their values)
/// unless they are its inputs' layouts already, and the search keeps them. The training
/// driver (driver/trainer.hpp) runs the configured steps.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/core/strategy.hpp>
#include <xshard/driver/gradient_path.hpp>
#include <xshard/graph/executable.hpp>
#include <xshard/graph/program_chain.hpp>
#include <xshard/graph/split.hpp>
#include <xshard/io/group_file.hpp>
#include <xshard/io/strategy_file.hpp>
#include <xshard/param/initializer.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/pipeline/action.hpp>
#include <xshard/pipeline/pipeline.hpp>
#include <xshard/pipeline/stages.hpp>
#include <xshard/search/machine_model.hpp>
#include <xshard/search/program_search.hpp>
#include <xshard/search/program_strategy_file.hpp>
#include <xshard/train/gradients.hpp>
#include <xshard/train/hsdp.hpp>
#include <xshard/train/lay_out.hpp>
#include <xshard/train/norms.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace xshard {

/// MindSpore's parallel_mode: the strategy engine.
enum class parallel_mode {
    semi_auto,             ///< the layers' own strategies (xshard's layouts)
    sharding_propagation,  ///< propagated from annotated operators (propagate_strategies)
    recursive_programming, ///< searched for every operator (search_strategy)
};

/// "semi_auto", "sharding_propagation", "recursive_programming".
constexpr std::string_view to_string(parallel_mode m) {
    switch (m) {
    case parallel_mode::semi_auto:
        return "semi_auto";
    case parallel_mode::sharding_propagation:
        return "sharding_propagation";
    case parallel_mode::recursive_programming:
        return "recursive_programming";
    }
    return "unknown";
}

/// The mode called `name`, if it is one.
constexpr std::optional<parallel_mode> parse_parallel_mode(std::string_view name) {
    for (auto m : {parallel_mode::semi_auto, parallel_mode::sharding_propagation,
                   parallel_mode::recursive_programming})
        if (name == to_string(m))
            return m;
    return std::nullopt;
}

/// MindSpore's comm_fusion config dict: `openstate` and the fusion of each collective kind
/// (unset: automatic). allreduce takes modes auto, size and index; allgather and
/// reducescatter auto and size. A size threshold must be larger than 0 MB. openstate false
/// turns fusion off (every tensor travels on its own).
struct comm_fusion_options {
    bool openstate = true;
    std::optional<fusion_threshold> allreduce = std::nullopt;
    std::optional<fusion_threshold> allgather = std::nullopt;
    std::optional<fusion_threshold> reducescatter = std::nullopt;
};

/// What no_init_parameters_in_compile initialises with: MindSpore's global seed
/// (ms.set_seed) and the initializer of each parameter (param/initializer.hpp).
struct deferred_init_options {
    std::uint64_t seed = 1;
    initializer_rule rule = default_initializer;
};

/// MindSpore's pipeline(stages, output_broadcast, interleave, scheduler).
struct pipeline_config {
    int stages = 1;
    bool output_broadcast = false;
    bool interleave = false;
    std::string scheduler = "1f1b";
    /// Model chunks per rank when interleaving (interleave, or the "interleaved" scheduler):
    /// 2 to 64; the chain needs at least stages x virtual_stages modules. Interleaved zero
    /// bubble (ZB-V) is not offered: its V-shaped placement of chunks needs a schedule xshard's
    /// runtime does not have, which runs ZB-H1 on one chunk per rank ("zero_bubble").
    int virtual_stages = 2;
};

/// The configuration of parallel training of `Model` (a parameter container) on a mesh (see
/// the file comment). The model and the mesh must outlive it.
template <parameter_container Model, mesh_type Mesh>
class auto_parallel {
public:
    using model_type = Model;
    using mesh_type = Mesh;

    /// Configures `model` on `mesh` with `mode`. No communication.
    auto_parallel(Model& model, const Mesh& mesh, parallel_mode mode = parallel_mode::semi_auto)
        : model_(&model)
        , mesh_(mesh)
        , mode_(mode) {}

    /// As above, the mode by MindSpore's name; an unknown name raises on every rank (one
    /// agreement over the mesh).
    auto_parallel(Model& model, const Mesh& mesh, std::string_view mode)
        : model_(&model)
        , mesh_(mesh) {
        const auto m = parse_parallel_mode(mode);
        agree(m ? std::nullopt
                : std::optional<std::string>(
                      "xshard: auto_parallel: parallel_mode must be one of semi_auto, "
                      "sharding_propagation, recursive_programming, not '" +
                      std::string(mode) + "'"));
        mode_ = *m;
    }

    // --- MindSpore's methods ----------------------------------------------------------------

    /// Fusion of the collectives (MindSpore's comm_fusion). Agreed over the mesh.
    void comm_fusion(const comm_fusion_options& c) {
        std::optional<std::string> problem;
        const auto check = [&](const char* kind, const std::optional<fusion_threshold>& f,
                               bool index_allowed) {
            if (problem || !f)
                return;
            if (f->how == fusion_threshold::mode::index && !index_allowed)
                problem = std::string("xshard: comm_fusion: ") + kind +
                          " fusion takes modes auto and size, not index";
            else if (f->how == fusion_threshold::mode::size && !(f->threshold_mib > 0))
                problem = std::string("xshard: comm_fusion: the ") + kind +
                          " fusion threshold must be larger than 0 MB, not " +
                          std::to_string(f->threshold_mib);
            else if (f->how == fusion_threshold::mode::index) {
                const std::size_t n = parameter_records(std::as_const(*model_)).size();
                if (auto p = f->problem(n))
                    problem = *p;
            }
        };
        check("allreduce", c.allreduce, true);
        check("allgather", c.allgather, false);
        check("reducescatter", c.reducescatter, false);
        agree(problem);
        const fusion_threshold off{fusion_threshold::mode::size, 0};
        auto& f = gradients_.fusion;
        f.allreduce = c.openstate ? c.allreduce.value_or(fusion_threshold{}) : off;
        f.allgather = c.openstate ? c.allgather.value_or(fusion_threshold{}) : off;
        f.reducescatter = c.openstate ? c.reducescatter.value_or(fusion_threshold{}) : off;
    }

    /// The dataset strategy by name: "data_parallel" or "full_batch". Agreed over the mesh.
    void dataset_strategy(std::string_view config) {
        std::optional<std::string> problem;
        auto mode = xshard::dataset_strategy::data_parallel;
        if (config == "full_batch")
            mode = xshard::dataset_strategy::full_batch;
        else if (config != "data_parallel")
            problem = "xshard: dataset_strategy: the strategy must be 'full_batch' or "
                      "'data_parallel', not '" +
                      std::string(config) + "'";
        agree(problem); // a failed call changes nothing on any rank
        dataset_ = mode;
        input_layouts_.clear();
    }
    /// The dataset strategy as one strategy (split counts) per input, e.g. {{2, 1}, {2}}:
    /// each resolved against the mesh. An empty list (MindSpore's None) or a strategy that
    /// fits no mesh axis raises on every rank.
    void dataset_strategy(const std::vector<strategy>& config) {
        std::optional<std::string> problem;
        std::vector<layout> layouts;
        if (config.empty())
            problem = "xshard: dataset_strategy: the strategy is empty (MindSpore's None)";
        for (const auto& s : config) {
            if (problem)
                break;
            try {
                layouts.push_back(resolve(s, mesh_.shape()));
            } catch (const std::exception& e) {
                problem = std::string("xshard: dataset_strategy: ") + e.what();
            }
        }
        agree(problem);
        input_layouts_ = std::move(layouts);
        dataset_ = xshard::dataset_strategy::unset;
    }
    /// The dataset strategy as one layout per input (MindSpore's tuple of Layout): each must
    /// name axes of the mesh. Agreed over the mesh.
    void dataset_strategy(const std::vector<layout>& config) {
        std::optional<std::string> problem;
        if (config.empty())
            problem = "xshard: dataset_strategy: the layouts are empty (MindSpore's None)";
        for (const auto& l : config) {
            if (problem)
                break;
            for (const auto& axes : l.dims)
                for (const auto& a : axes)
                    if (!problem && !mesh_.has_axis(a.view()))
                        problem = "xshard: dataset_strategy: layout " + l.to_string() +
                                  " names axis '" + std::string(a.view()) + "', which the mesh " +
                                  mesh_.shape().to_string() + " lacks";
        }
        agree(problem);
        input_layouts_ = config;
        dataset_ = xshard::dataset_strategy::unset;
    }

    /// Optimizer sharding (MindSpore's hsdp). shard_size -1 or in (0, ranks]; threshold >= 0
    /// KB; level1, level2 or level3 (level3: the driver runs its steps through hsdp::forward /
    /// backward; under pipeline stages > 1 each stage's weights are gathered once per step
    /// around its micro-batches, xshard::trainer).
    /// Agreed over the mesh.
    void hsdp(const hsdp_options& o) {
        std::optional<std::string> problem;
        if (!(o.shard_size == -1 || o.shard_size > 0))
            problem = "xshard: hsdp: shard_size must be a positive integer or -1, not " +
                      std::to_string(o.shard_size);
        else if (o.shard_size > mesh_.size())
            problem = "xshard: hsdp: shard_size must be in (0, " + std::to_string(mesh_.size()) +
                      "] (the device number) or -1, not " + std::to_string(o.shard_size);
        else if (o.threshold < 0)
            problem = "xshard: hsdp: threshold must be a positive integer or 0 (KB), not " +
                      std::to_string(o.threshold);
        else if (int(o.optimizer_level) < 1 || int(o.optimizer_level) > 3)
            problem = "xshard: hsdp: optimizer_level must be one of level1, level2, level3";
        agree(problem);
        hsdp_ = o;
    }
    /// MindSpore's spelling: hsdp(shard_size=-1, threshold=64, optimizer_level="level1").
    void hsdp(int shard_size = -1, std::int64_t threshold = 64,
              std::string_view optimizer_level = "level1") {
        const std::string_view name = optimizer_level;
        std::optional<xshard::optimizer_level> level;
        for (auto l : {xshard::optimizer_level::level1, xshard::optimizer_level::level2,
                       xshard::optimizer_level::level3})
            if (name == to_string(l))
                level = l;
        agree(level ? std::nullopt
                    : std::optional<std::string>(
                          "xshard: hsdp: optimizer_level must be one of level1, level2, "
                          "level3, not '" +
                          std::string(name) + "'"));
        hsdp(hsdp_options{shard_size, threshold, *level});
    }

    /// How the driver synchronises the gradients without hsdp() (driver/gradient_path.hpp):
    /// automatic (the default: the sharded update where the machine model prices it lower),
    /// all_reduce, or sharded_update (reduce-scatter, the update on each rank's slice,
    /// all-gather). Not under pipeline stages > 1, whose stages reduce their own gradients.
    void gradient_path(xshard::gradient_path p) { gradient_path_ = p; }
    xshard::gradient_path gradient_path_config() const noexcept { return gradient_path_; }

    /// Pipeline parallelism (MindSpore's pipeline). stages > 0 and dividing the mesh's ranks;
    /// scheduler one of gpipe, 1f1b, interleaved, zero_bubble. Agreed over the mesh.
    void pipeline(const pipeline_config& c) {
        std::optional<std::string> problem;
        if (c.stages <= 0)
            problem = "xshard: pipeline: stages must be > 0, not " + std::to_string(c.stages);
        else if (mesh_.size() % c.stages != 0)
            problem = "xshard: pipeline: " + std::to_string(c.stages) +
                      " stages do not divide the mesh's " + std::to_string(mesh_.size()) + " ranks";
        else if (c.virtual_stages < 2 || c.virtual_stages > 64)
            problem = "xshard: pipeline: virtual_stages must be in [2, 64], not " +
                      std::to_string(c.virtual_stages);
        else {
            try {
                (void)xshard::pipeline::parse_schedule(c.scheduler);
            } catch (const std::exception& e) {
                problem = std::string("xshard: pipeline: scheduler is not supported: ") + e.what();
            }
        }
        agree(problem);
        pipeline_ = c;
    }
    /// MindSpore's spelling: pipeline(stages=1, output_broadcast=false, interleave=false,
    /// scheduler="1f1b").
    void pipeline(int stages = 1, bool output_broadcast = false, bool interleave = false,
                  std::string_view scheduler = "1f1b") {
        pipeline(pipeline_config{stages, output_broadcast, interleave, std::string(scheduler)});
    }

    /// Averages the gradients over their copies after the all-reduce.
    void enable_gradients_mean() { gradients_.mean = true; }
    /// Reductions forced to float32 for 16-bit data (gradients' all-reduce included).
    void enable_fp32_communication() { fp32_communication_ = true; }
    /// 16-bit gradients all-reduced in their own type (unless enable_fp32_communication).
    void disable_gradient_fp32_sync() { gradient_fp32_sync_ = false; }
    /// MindSpore: "the mean operator is not executed backwards when the calculation is
    /// repeated". The loss is computed repeatedly on the `loss_repetitions()` ranks r that
    /// hold the same rows of the batch; by default (as MindSpore's loss repeated mean) the
    /// loss gradient's terms over those r ranks sum to the gradient of the loss, and after
    /// this call the driver (xshard::trainer) scales the backward seed (the loss gradient) by r,
    /// so every gradient comes out r times the default's, as MindSpore's do without the
    /// division by r. Pure data parallelism (r = 1) is unchanged. A hand-written loop applies
    /// it as `model.backward(loss.backward(net.loss_repetitions()))`.
    void disable_loss_repeated_mean() { loss_repeated_mean_ = false; }
    /// Prints each rank's local gradient norms in report_local_norms.
    void print_local_norm() { print_local_norm_ = true; }
    /// Appends each rank's local norms to files in `directory` (created now, on every rank)
    /// in report_local_norms, without printing. Agreed over the mesh.
    void dump_local_norm(const std::string& directory) {
        std::optional<std::string> problem;
        if (directory.empty())
            problem = "xshard: dump_local_norm: the directory is empty";
        else {
            std::error_code ec;
            std::filesystem::create_directories(directory, ec);
            if (ec)
                problem = "xshard: dump_local_norm: cannot create " + directory + " on rank " +
                          std::to_string(mesh_.rank()) + ": " + ec.message();
        }
        agree(problem);
        dump_directory_ = directory;
    }
    /// Local norms on every rank (the "device" is the rank: as print_local_norm).
    void enable_device_local_norm() { device_local_norm_ = true; }

    /// Where compile() saves the parameters' strategies. Agreed over the mesh.
    void save_param_strategy_file(const std::string& path) {
        agree(path_problem("save_param_strategy_file", path, false));
        save_param_strategy_ = path;
    }
    /// Where load_param_strategy() reads the parameters' strategies from: compile() lays
    /// each parameter the file names out as it says (train/lay_out.hpp; a compiled program
    /// is compiled again with them as its weights' layouts), and raises on every rank for a
    /// file of another mesh, or naming a parameter the model lacks or of another shape. A
    /// pipeline's file, or one for a model searched at run time, raises too. Agreed.
    void load_param_strategy_file(const std::string& path) {
        agree(path_problem("load_param_strategy_file", path, false));
        load_param_strategy_ = path;
    }
    /// Where to save the operator strategies: an absolute path, and only with parallel_mode
    /// sharding_propagation (whose engine writes it). Agreed over the mesh.
    void save_operator_strategy_file(const std::string& path) {
        agree(path_problem("save_operator_strategy_file", path, true));
        save_operator_strategy_ = path;
    }
    /// Where to load the operator strategies from (as save_operator_strategy_file).
    void load_operator_strategy_file(const std::string& path) {
        agree(path_problem("load_operator_strategy_file", path, true));
        load_operator_strategy_ = path;
    }
    /// The machine the engines (recursive_programming, sharding_propagation) price with:
    /// search/machine_model.hpp's defaults until set; `measure_machine<T>(comm)`
    /// (search/calibrate.hpp) measures the ranks', and `calibrate_ops` fits its primitives'
    /// factors on a profiled step. Positive GEMM speed, memory bandwidth, element size,
    /// transcendental functions' cost and factors, and a GEMM half dimension that is finite
    /// and not negative, else xshard::error on every rank. Agreed over the mesh.
    void set_machine_model(const machine_model& m) {
        bool factors = true;
        for (const auto& [op, f] : m.op_scale)
            factors = factors && f > 0 && std::isfinite(f);
        agree(m.gemm_flops > 0 && m.memory_bandwidth > 0 && m.element > 0 &&
                      m.transcendental_seconds > 0 && std::isfinite(m.transcendental_seconds) &&
                      m.optimizer_states >= 0 && m.gemm_half_dimension >= 0 &&
                      std::isfinite(m.gemm_half_dimension) && factors
                  ? std::nullopt
                  : std::optional<std::string>(
                        "xshard: set_machine_model: the GEMM speed, memory bandwidth, element "
                        "size, transcendental functions' cost and primitives' factors must be "
                        "positive, and the optimizer states and the GEMM half dimension finite "
                        "and not negative"));
        machine_ = m;
    }
    const machine_model& machine() const noexcept { return machine_; }
    /// The bytes a rank may hold (MindSpore's context `max_device_memory`): the engines
    /// (recursive_programming, sharding_propagation) keep each rank's weights, gradients,
    /// optimizer state and activations within it, and raise on every rank when no strategy
    /// fits. Positive, else xshard::error on every rank. Agreed over the mesh.
    void max_device_memory(double bytes) {
        agree(bytes > 0 ? std::nullopt
                        : std::optional<std::string>(
                              "xshard: max_device_memory: the bytes must be positive, not " +
                              std::to_string(bytes)));
        max_device_memory_ = bytes;
    }
    double max_device_memory() const noexcept { return max_device_memory_; }
    /// Strategy files hold every parameter, not only the trainable ones.
    void disable_strategy_file_only_for_trainable_params() { only_trainable_ = false; }
    /// Where compile() saves the communication groups (io/group_file.hpp). Agreed.
    void set_group_ckpt_save_file(const std::string& path) {
        agree(path_problem("set_group_ckpt_save_file", path, false));
        group_file_ = path;
    }
    /// Deferred initialisation (param/initializer.hpp): compile() initialises every weight in
    /// place, each rank computing only its own blocks (O(block) time, no whole weight), with
    /// the values of a whole initialisation under `options.seed` (MindSpore's set_seed) by
    /// `options.rule` (default: HeUniform(sqrt 5) for matrices, zeros for biases). The first
    /// compile() does it, once. No communication.
    void no_init_parameters_in_compile(deferred_init_options options = {}) {
        no_init_ = std::move(options);
    }

    // --- the configured pieces --------------------------------------------------------------

    Model& model() const noexcept { return *model_; }
    const Mesh& mesh() const noexcept { return mesh_; }
    parallel_mode mode() const noexcept { return mode_; }

    /// The options of gradient synchronisation (mean, fp32 communication, fusion).
    xshard::gradient_options gradient_options() const {
        auto o = gradients_;
        o.fp32_communication = fp32_communication_ || gradient_fp32_sync_;
        return o;
    }
    bool fp32_communication() const noexcept { return fp32_communication_; }
    bool gradient_fp32_sync() const noexcept { return gradient_fp32_sync_; }
    bool loss_repeated_mean() const noexcept { return loss_repeated_mean_; }

    /// How many ranks compute the loss of the same rows (MindSpore's repeated calculation
    /// number of the loss): the ranks of the model's mesh (the mesh without `pipeline_axis`
    /// when pipeline stages > 1 or that axis has one rank: a stage's mesh, where the model
    /// and its batches live) divided by the ranks the batch's rows are
    /// split over under the dataset strategy: data_parallel the model mesh's first axis,
    /// full_batch none, a tuple of layouts the axes of the first input's first dimension.
    /// On a (dp, tp) mesh under data_parallel: tp. The factor disable_loss_repeated_mean()
    /// scales the loss gradient by (whether or not it was called). No communication.
    int loss_repetitions(std::string_view pipeline_axis = "pp") const {
        const auto& ms = mesh_.shape();
        int ranks = 1, split = 1;
        bool first = true;
        for (std::size_t i = 0; i < ms.ndim(); ++i) {
            if ((pipeline_.stages > 1 || ms.sizes[i] == 1) && ms.names[i].view() == pipeline_axis)
                continue; // the stages' axis (of one stage: the model is on the stage mesh)
            ranks *= ms.sizes[i];
            if (first && dataset_ == xshard::dataset_strategy::data_parallel)
                split = ms.sizes[i];
            first = false;
        }
        if (dataset_ == xshard::dataset_strategy::unset && !input_layouts_.empty() &&
            !input_layouts_[0].dims.empty())
            for (const auto& a : input_layouts_[0].dims[0])
                for (std::size_t i = 0; i < ms.ndim(); ++i)
                    if (ms.names[i].view() == a.view())
                        split *= ms.sizes[i];
        return split > 0 && ranks % split == 0 ? ranks / split : 1;
    }

    /// The hsdp options, when hsdp() was called.
    const std::optional<hsdp_options>& hsdp_config() const noexcept { return hsdp_; }
    /// Optimizer sharding of the model with the configured options and gradient options.
    /// Collective over the mesh (xshard::hsdp's construction); throws on every rank when
    /// hsdp() was not called. At level3 the loop runs its passes through the sharding's
    /// forward and backward (train/hsdp.hpp).
    std::unique_ptr<xshard::hsdp<Model>> make_hsdp() const {
        agree(hsdp_ ? std::nullopt
                    : std::optional<std::string>(
                          "xshard: auto_parallel: make_hsdp without hsdp() configured"));
        return std::make_unique<xshard::hsdp<Model>>(*model_, *hsdp_, gradient_options());
    }

    const pipeline_config& pipeline_settings() const noexcept { return pipeline_; }
    /// The strategy the search on programs found at the last compile() of a compiled program
    /// in sharding_propagation or recursive_programming (none otherwise).
    const std::optional<program_strategy>& searched_program() const noexcept {
        return program_plan_;
    }
    /// Where the search cuts a program chain into pipeline stages (the index of the first
    /// module of stages 1, 2, ...): the modules balanced by the seconds the search predicts
    /// for their nodes (compute, the redistributions into them and their weights' gradient
    /// synchronisation), at the last compile() under pipeline(stages > 1) in
    /// sharding_propagation or recursive_programming; empty otherwise. The training driver
    /// cuts the chain there unless its stage_config says otherwise or the schedule
    /// interleaves.
    const std::vector<std::size_t>& searched_stage_starts() const noexcept { return stage_starts_; }
    /// The pipeline runtime's options for `micro_batches` micro-batches and the module ->
    /// stage assignment `stage_config` (MindSpore's Pipeline stage_config): the configured
    /// scheduler, output_broadcast, and interleave as the interleaved schedule with the
    /// configured virtual stages per rank (two by default). Throws for interleave with a scheduler
    /// other than 1f1b or interleaved (not supported yet). No communication.
    xshard::pipeline::pipeline_options
    pipeline_options(int micro_batches, std::map<std::string, int> stage_config = {}) const {
        if (auto p = pipeline_problem())
            throw error(*p);
        xshard::pipeline::pipeline_options o;
        o.micro_batches = micro_batches;
        o.scheduler = xshard::pipeline::parse_schedule(pipeline_.scheduler);
        if (pipeline_.interleave || o.scheduler == xshard::pipeline::schedule_kind::interleaved) {
            o.scheduler = xshard::pipeline::schedule_kind::interleaved;
            o.virtual_stages = pipeline_.virtual_stages;
        }
        o.stage_config = std::move(stage_config);
        o.output_broadcast = pipeline_.output_broadcast;
        return o;
    }

    /// The dataset strategy (data_parallel unless set; unset with per-input layouts).
    xshard::dataset_strategy dataset_mode() const noexcept { return dataset_; }
    /// The per-input layouts of a tuple dataset strategy (empty for a named one).
    const std::vector<layout>& input_layouts() const noexcept { return input_layouts_; }
    /// The mesh with the named dataset strategy, for shard() and the data loader.
    Mesh dataset_mesh() const {
        return dataset_ == xshard::dataset_strategy::unset ? mesh_
                                                           : mesh_.with_dataset_strategy(dataset_);
    }

    /// Whether strategy files hold only the trainable parameters.
    bool strategy_file_only_trainable() const noexcept { return only_trainable_; }
    const std::string& param_strategy_save_path() const noexcept { return save_param_strategy_; }
    const std::string& group_save_path() const noexcept { return group_file_; }
    const std::string& operator_strategy_save_path() const noexcept {
        return save_operator_strategy_;
    }
    const std::string& operator_strategy_load_path() const noexcept {
        return load_operator_strategy_;
    }
    bool no_init_parameters() const noexcept { return no_init_.has_value(); }
    const std::string& local_norm_directory() const noexcept { return dump_directory_; }

    /// The strategy file set by load_param_strategy_file, checked against the mesh. Throws
    /// io_error on every rank for a missing, malformed or mismatched file (one agreement).
    strategy_file load_param_strategy() const {
        agree(load_param_strategy_.empty()
                  ? std::optional<std::string>("xshard: load_param_strategy without "
                                               "load_param_strategy_file")
                  : std::nullopt);
        return agreed<io_error>(mesh_.comm(), [&] {
            auto f = load_strategy_file(load_param_strategy_);
            f.check_mesh(mesh_.shape());
            return f;
        });
    }

    /// MindSpore's graph compilation: raises on every rank for a setting whose mechanism
    /// xshard lacks (see the file comment), runs the parallel mode's search on a program (its
    /// strategy kept: searched_program), lays the parameters out by the loaded parameter
    /// strategy file and a program's inputs by the dataset strategy, initialises the weights
    /// the first time when no_init_parameters_in_compile was called, then saves the parameter
    /// strategy file and the group file when set. Collective over the mesh.
    void compile() const {
        std::optional<std::string> problem;
        if (mode_ != parallel_mode::semi_auto && !detail::is_compiled_program<Model> &&
            !detail::is_program_chain<Model>)
            problem = "xshard: auto_parallel: parallel_mode " + std::string(to_string(mode_)) +
                      " is not available for this model: the engines search a program "
                      "(xshard::compile, xshard::program_chain); a model whose layers carry "
                      "their layouts in their types runs semi_auto";
        else
            problem = pipeline_problem();
        agree(problem);
        stage_starts_.clear();
        planned_ = planned_layouts();
        if constexpr (detail::is_compiled_program<Model>) {
            if (mode_ != parallel_mode::semi_auto)
                search_program_model();
            else
                lay_program_out();
        } else if constexpr (detail::is_program_chain<Model>) {
            if (mode_ != parallel_mode::semi_auto)
                search_program_model();
            else if (!planned_.empty())
                agreed(mesh_.comm(), [&] { model_->recompile(model_->source(), chain_options()); });
        } else if (!planned_.empty()) {
            agreed(mesh_.comm(), [&] { lay_out_parameters(*model_, planned_); });
        }
        if (no_init_ && !initialized_) {
            // A rule throwing on some ranks only raises on every rank.
            agreed(mesh_.comm(),
                   [&] { initialize_parameters(*model_, no_init_->seed, no_init_->rule); });
            initialized_ = true;
        } else if (!no_init_) {
            agreed(mesh_.comm(), [&] { refuse_undrawn_weights(); });
        }
        if (!save_param_strategy_.empty())
            save_strategy_file(save_param_strategy_, *model_, !only_trainable_, pipeline_.stages);
        if (!group_file_.empty())
            save_group_file(group_file_, mesh_);
    }

    /// After a step's gradient synchronisation: prints (print_local_norm,
    /// enable_device_local_norm) to `out` and dumps (dump_local_norm) this rank's local norms
    /// of `grads` at `step`. No communication.
    template <parameter_container G>
    void report_local_norms(const G& grads, long step, std::ostream& out = std::cout) const {
        if (print_local_norm_ || device_local_norm_)
            xshard::print_local_norm(grads, out);
        if (!dump_directory_.empty())
            xshard::dump_local_norm(grads, dump_directory_, step);
    }
    bool local_norm_enabled() const noexcept {
        return print_local_norm_ || device_local_norm_ || !dump_directory_.empty();
    }

private:
    /// Throws when a weight holds NaN: built under xshard::no_init_parameters (param/no_init.hpp)
    /// and never initialised.
    void refuse_undrawn_weights() const {
        for_each_weight(*model_, [&](const std::string& name, auto& w) {
            using V = typename std::remove_cvref_t<decltype(w.value)>::value_type;
            if constexpr (std::numeric_limits<V>::has_quiet_NaN) {
                const auto& l = w.value.local();
                if (std::any_of(l.data(), l.data() + l.size(), [](V v) { return v != v; }))
                    throw error("xshard: auto_parallel: compile: the weight '" + name +
                                "' holds NaN: a model built under xshard::no_init_parameters "
                                "needs no_init_parameters_in_compile() to initialise it");
            }
        });
    }

    void agree(const std::optional<std::string>& problem) const {
        agree_on_error(mesh_.comm(), problem);
    }

    /// The layouts of the parameter strategy file (load_param_strategy_file), checked
    /// against the model: each parameter it names is the model's, of the same shape, on the
    /// file's mesh. Empty without a file. Raises on every rank where the file does not fit.
    layout_dict planned_layouts() const {
        if (load_param_strategy_.empty())
            return {};
        const auto file = load_param_strategy();
        std::map<std::string, std::vector<std::size_t>> shapes;
        for (auto& r : parameter_records(std::as_const(*model_)))
            shapes[r.name] = std::move(r.shape);
        std::optional<std::string> problem;
        const std::string what = "xshard: load_param_strategy_file: '" + load_param_strategy_ + "'";
        for (const auto& e : file.parameters) {
            const auto it = shapes.find(e.name);
            if (problem)
                break;
            if (e.stage >= 0 || e.mesh)
                problem = what + " is a pipeline's, whose stages lay their own modules out; "
                                 "resume a pipeline from its checkpoint";
            else if (it == shapes.end())
                problem = what + " lays out '" + e.name + "', which the model does not have";
            else if (it->second != e.shape)
                problem = what + " gives '" + e.name + "' the shape " +
                          detail::shape_string(e.shape) + ", the model " +
                          detail::shape_string(it->second);
        }
        agree(problem);
        return file.layouts();
    }

    /// The compiled program's options with the dataset strategy's layouts for its inputs
    /// (the first input's for the program's first input, and so on; a program that takes
    /// fewer inputs leaves the rest, the labels, to the loss), the parameter strategy file's
    /// for its weights, and, where program_shards_weights(), every weight of at least hsdp's
    /// threshold kept split over every mesh axis it does not use
    /// (layout_options::weight_shard_axes).
    compile_options program_options() const {
        auto o = model_->options();
        const auto& prog = model_->source();
        for (std::size_t i = 0; i < std::min(prog.inputs().size(), input_layouts_.size()); ++i)
            o.layouts.input_layouts[prog.value(prog.inputs()[i]).name] = input_layouts_[i];
        for (const auto& [name, l] : planned_)
            o.layouts.weight_layouts[name] = l;
        if (program_shards_weights()) {
            o.layouts.weight_shard_axes.clear();
            for (const auto& a : mesh_.shape().names)
                o.layouts.weight_shard_axes.emplace_back(a.view());
            o.layouts.weight_shard_min_bytes = std::size_t(hsdp_->threshold) * 1024U;
        }
        return o;
    }

    /// Whether hsdp level3 runs inside the compiled program: its weights kept split over
    /// every axis of their data-parallel group (shard_size -1), each gathered just before
    /// each use and its gradient reduce-scattered by the program's backward pass, so that a
    /// step holds one gathered weight at a time where the sharding (one unit) gathers all of
    /// them before the forward pass. Not under gradients_mean: the program's gradients are
    /// the sums, which the mean divides by the copies the weight would have had.
    bool program_shards_weights() const noexcept {
        return detail::is_compiled_program<Model> && hsdp_ &&
               hsdp_->optimizer_level == optimizer_level::level3 && hsdp_->shard_size == -1 &&
               !gradients_.mean;
    }

    /// A program chain's options (it lives on its own mesh, a pipeline's stage mesh, with
    /// its own inputs' layouts), with the parameter strategy file's weight layouts.
    compile_options chain_options() const {
        auto o = model_->options();
        for (const auto& [name, l] : planned_)
            o.layouts.weight_layouts[name] = l;
        return o;
    }

    /// semi_auto on a compiled program: compiles it again with program_options() where the
    /// dataset strategy, the parameter strategy file or hsdp level3 changes its inputs' or
    /// weights' layouts, keeping the weights' values (compiled_program::recompile). Raises on every
    /// rank where a layout does not fit.
    void lay_program_out() const {
        auto o = program_options();
        const auto& was = model_->options().layouts;
        if (o.layouts.input_layouts == was.input_layouts &&
            o.layouts.weight_layouts == was.weight_layouts &&
            o.layouts.weight_shard_axes == was.weight_shard_axes &&
            o.layouts.weight_shard_min_bytes == was.weight_shard_min_bytes)
            return;
        auto& net = *model_;
        agreed(mesh_.comm(), [&] { net.recompile(net.source(), std::move(o)); });
    }

    /// The parallel mode's search on a compiled program or a program chain (its whole
    /// program, on its mesh, with its options): the operator strategy file (when
    /// set) pins its nodes, the search (keeping annotations in sharding_propagation) fills
    /// in the rest, rank 0 saves the strategy when asked, and the program is compiled again
    /// with the layouts found, keeping the weights' values (compiled_program::recompile). Every
    /// rank searches the same program alike; a failure on any rank raises on every rank.
    void search_program_model() const {
        auto& net = *model_;
        // A program chain lives on its own mesh (a pipeline's stage mesh) with its options.
        const auto options = [&] {
            if constexpr (detail::is_program_chain<Model>)
                return chain_options();
            else
                return program_options();
        }();
        const auto& shape = net.mesh().shape();
        program_plan_ = agreed(mesh_.comm(), [&] {
            program p = net.source();
            if (!load_operator_strategy_.empty())
                load_program_strategy(load_operator_strategy_, shape).apply(p);
            auto found =
                search_program(p, shape,
                               {.machine = machine_,
                                .layouts = options.layouts,
                                .keep_annotations = mode_ == parallel_mode::sharding_propagation,
                                .input_gradients = net.options().input_gradients,
                                .memory_per_rank = max_device_memory_});
            return found;
        });
        agreed(mesh_.comm(), [&] {
            if (!save_operator_strategy_.empty() && mesh_.comm().rank() == 0)
                save_program_strategy(save_operator_strategy_, *program_plan_);
        });
        program p = net.source();
        program_plan_->apply(p);
        agreed(mesh_.comm(), [&] { net.recompile(std::move(p), options); });
        if constexpr (detail::is_program_chain<Model>)
            stage_starts_ = pipeline_.stages > 1 ? priced_stage_starts(net, *program_plan_)
                                                 : std::vector<std::size_t>{};
    }

    /// The chain's modules cut into the pipeline's stages balanced by the seconds `plan`
    /// predicts for each module's nodes (pipeline::stages_by_cost): the index of the first
    /// module of stages 1, 2, ...; empty when the chain has fewer modules than stages (the
    /// pipeline then raises, naming them).
    std::vector<std::size_t> priced_stage_starts(const Model& chain,
                                                 const program_strategy& plan) const {
        std::map<std::string, double> seconds;
        for (const auto& n : plan.nodes)
            seconds[detail::top_scope(n.node)] += n.compute + n.communication + n.gradient_sync;
        std::vector<std::string> names;
        std::vector<double> cost;
        for (const auto& l : chain.layers()) {
            names.push_back(l.name());
            cost.push_back(seconds[l.name()]);
        }
        std::vector<std::size_t> starts;
        if (names.size() < std::size_t(pipeline_.stages))
            return starts;
        const auto stage = xshard::pipeline::stages_by_cost(names, cost, pipeline_.stages);
        for (std::size_t i = 1; i < stage.size(); ++i)
            if (stage[i] != stage[i - 1])
                starts.push_back(i);
        return starts;
    }

    std::optional<std::string> path_problem(std::string_view method, const std::string& path,
                                            bool operator_file) const {
        const std::string m = "xshard: " + std::string(method);
        if (path.empty())
            return m + ": the path is empty";
        if (operator_file && !std::filesystem::path(path).is_absolute())
            return m + ": the path must be absolute, not '" + path + "'";
        if (operator_file && mode_ != parallel_mode::sharding_propagation)
            return m + " works only with parallel_mode sharding_propagation, not " +
                   std::string(to_string(mode_));
        return std::nullopt;
    }

    std::optional<std::string> pipeline_problem() const {
        if (!pipeline_.interleave)
            return std::nullopt;
        const auto k = xshard::pipeline::parse_schedule(pipeline_.scheduler);
        if (k != xshard::pipeline::schedule_kind::one_f_one_b &&
            k != xshard::pipeline::schedule_kind::interleaved)
            return "xshard: pipeline: interleave with scheduler " + pipeline_.scheduler +
                   " is not supported yet (interleaving runs the 1f1b order)";
        return std::nullopt;
    }

    Model* model_;
    Mesh mesh_;
    parallel_mode mode_ = parallel_mode::semi_auto;
    xshard::gradient_options gradients_{};
    bool fp32_communication_ = false;
    bool gradient_fp32_sync_ = true;
    bool loss_repeated_mean_ = true;
    std::optional<hsdp_options> hsdp_;
    xshard::gradient_path gradient_path_ = xshard::gradient_path::automatic;
    pipeline_config pipeline_{};
    xshard::dataset_strategy dataset_ = xshard::dataset_strategy::data_parallel;
    std::vector<layout> input_layouts_;
    bool print_local_norm_ = false;
    bool device_local_norm_ = false;
    std::string dump_directory_;
    std::string save_param_strategy_, load_param_strategy_;
    std::string save_operator_strategy_, load_operator_strategy_;
    machine_model machine_{}; ///< what the engines price with (set_machine_model)
    /// The engines' cap on each rank's bytes (max_device_memory).
    double max_device_memory_ = std::numeric_limits<double>::infinity();
    bool only_trainable_ = true;
    std::string group_file_;
    std::optional<deferred_init_options> no_init_;
    mutable bool initialized_ = false;                     // compile() initialises once
    mutable std::optional<program_strategy> program_plan_; // compile()'s search on a program
    mutable std::vector<std::size_t> stage_starts_;        // the chain's cut the search priced
    mutable layout_dict planned_; // compile()'s layouts from the parameter strategy file
};

} // namespace xshard
