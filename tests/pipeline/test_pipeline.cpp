// The pipeline runtime against one rank: for every factorisation pp x dp x tp of the world
// (pp up to 4) and every schedule, one step's loss and every gradient equal a one-rank
// forward and backward pass over the whole batch (1e-12), and the micro-batches in flight on
// each rank are the table's. Misuse raises the same error on every rank.

#include <xshard/nn/activation.hpp>
#include <xshard/nn/embedding.hpp>
#include <xshard/nn/linear.hpp>
#include <xshard/ops/reduce.hpp>
#include <xshard/optim/optimizers.hpp>
#include <xshard/pipeline/checkpoint.hpp>
#include <xshard/pipeline/pipeline.hpp>
#include <xshard/tensor/gather.hpp>
#include <xshard/train/broadcast.hpp>
#include <xshard/train/hsdp.hpp>

#include "expect_error.hpp"
#include "labelled_batch.hpp"
#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <xtensor/xrandom.hpp>

#include <csignal>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>

#include <sys/resource.h>

namespace {

namespace nn = xshard::nn;
namespace pp = xshard::pipeline;
using stage_mesh_t = xshard::mesh<"dp", "tp">;
using full_mesh_t = xshard::mesh<"pp", "dp", "tp">;
using X = nn::tensor<double, stage_mesh_t>;
using labels_t = nn::tensor<std::int64_t, stage_mesh_t, 1>;
constexpr std::size_t features = 6, classes = 5;

/// Nine modules: column/row-parallel pairs with activations between, logits split over tp.
auto make_model(const stage_mesh_t& m) {
    using T = double;
    return nn::sequential(nn::column_parallel_linear<T, stage_mesh_t>(m, features, 16, 1),
                          nn::relu_activation<T, stage_mesh_t>(m),
                          nn::row_parallel_linear<T, stage_mesh_t>(m, 16, 12, 2),
                          nn::gelu_activation<T, stage_mesh_t>(m),
                          nn::column_parallel_linear<T, stage_mesh_t>(m, 12, 12, 3),
                          nn::relu_activation<T, stage_mesh_t>(m),
                          nn::row_parallel_linear<T, stage_mesh_t>(m, 12, 10, 4),
                          nn::gelu_activation<T, stage_mesh_t>(m),
                          nn::column_parallel_linear<T, stage_mesh_t>(m, 10, classes, 5));
}

using batch = xshard::testing::labelled_batch;

batch make_batch(std::size_t rows, unsigned seed) {
    return xshard::testing::random_labelled_batch(rows, features, classes, seed);
}

/// The one-rank step: its loss and every gradient by name.
std::pair<double, std::map<std::string, xt::xarray<double>>> one_rank(const batch& b) {
    const stage_mesh_t one(xshard::communicator::self(), {1, 1});
    auto model = make_model(one);
    nn::parallel_cross_entropy<double, stage_mesh_t> loss;
    const auto x =
        xshard::distribute<xshard::dynamic_layout(2)>(one, b.x, nn::make_layout({"", ""}));
    const auto y = xshard::distribute<xshard::dynamic_layout(1)>(one, b.y, nn::make_layout({""}));
    const double value = loss.forward(model.forward(x), y);
    model.backward(loss.backward());
    std::map<std::string, xt::xarray<double>> grads;
    xshard::for_each_weight(model, [&](const std::string& name, auto& w) {
        grads[name] = xshard::gather_all(xshard::ops::resolve(w.grad));
    });
    return {value, grads};
}

/// The factorisations pp x dp x tp of `world` with pp <= 4 and tp <= 2.
std::vector<std::array<int, 3>> meshes(int world) {
    std::vector<std::array<int, 3>> out;
    for (int p = 1; p <= 4; ++p)
        for (int t = 1; t <= 2; ++t)
            if (world % (p * t) == 0)
                out.push_back({p, world / (p * t), t});
    return out;
}

TEST(pipeline, every_schedule_equals_one_rank) {
    const int world = xshard::testing::world().size();
    for (const auto& sizes : meshes(world)) {
        const full_mesh_t mesh(sizes);
        const auto stage_mesh = pp::stage_mesh_of<stage_mesh_t>(mesh);
        const int p = sizes[0], dp = sizes[1];
        const int m = 2 * p; // a multiple of p, for the interleaved schedule
        const std::size_t rows = std::size_t(m * dp * 2 + 1); // uneven blocks and chunks
        const auto b = make_batch(rows, 11);
        const auto [expected_loss, expected] = one_rank(b);
        const auto x = xshard::distribute<xshard::dynamic_layout(2)>(stage_mesh, b.x,
                                                                     nn::make_layout({"dp", ""}));
        const auto y =
            xshard::distribute<xshard::dynamic_layout(1)>(stage_mesh, b.y, nn::make_layout({"dp"}));
        // The interleaved schedule with 2, 3 and 4 chunks per rank where the 9 modules
        // give every virtual stage one.
        std::vector<std::pair<pp::schedule_kind, int>> runs{{pp::schedule_kind::gpipe, 1},
                                                            {pp::schedule_kind::one_f_one_b, 1},
                                                            {pp::schedule_kind::zero_bubble, 1}};
        for (int v = 2; v <= 4 && p * v <= 9; ++v)
            runs.emplace_back(pp::schedule_kind::interleaved, v);
        for (const auto& [kind, v] : runs) {
            const std::string where = "mesh pp=" + std::to_string(p) + " dp=" + std::to_string(dp) +
                                      " tp=" + std::to_string(sizes[2]) + ", " +
                                      std::string(pp::name(kind)) + " v=" + std::to_string(v) +
                                      ", rank " + std::to_string(mesh.rank());
            auto model = make_model(stage_mesh);
            nn::parallel_cross_entropy<double, stage_mesh_t> loss;
            pp::pipeline<decltype(model), X> pipe(mesh, "pp", stage_mesh, model,
                                                  {.micro_batches = m,
                                                   .scheduler = kind,
                                                   .virtual_stages = v,
                                                   .output_broadcast = true});
            const double value = pipe.step(x, y, loss);
            pipe.synchronize_gradients();
            EXPECT_NEAR(value, expected_loss, 1e-12) << where;
            EXPECT_EQ(pipe.last_step().peak_in_flight,
                      pipe.predicted().peak_in_flight[std::size_t(pipe.stage())])
                << where;
            int checked = 0;
            xshard::for_each_weight(pipe.local_parameters(), [&](const std::string& name, auto& w) {
                const xt::xarray<double> g = xshard::gather_all(xshard::ops::resolve(w.grad));
                ASSERT_TRUE(expected.count(name)) << name << ", " << where;
                EXPECT_TRUE(xt::allclose(g, expected.at(name), 1e-12, 1e-12))
                    << name << ", " << where;
                ++checked;
            });
            // Every weight of the model is checked on some stage.
            int total = checked;
            xshard::mpi::allreduce(mesh.sub<"pp">(), std::span(&total, 1), xshard::reduction::sum);
            EXPECT_EQ(total, int(expected.size())) << where;
        }
    }
}

/// Stages on meshes that factor their ranks differently (n x 1 and n/2 x 2 in turn), and a
/// stage that asks for its input whole: the boundaries are cross-mesh redistributions, and
/// the step still equals the one-rank run. The batch's rows are split over n blocks on the
/// first stage and the labels' over dp on the last, cut alike (micro_batch.hpp).
TEST(pipeline, stages_on_differently_shaped_meshes_equal_one_rank) {
    const int world = xshard::testing::world().size();
    for (int p = 2; p <= 4; ++p) {
        if (world % p != 0)
            continue;
        const int n = world / p;
        const full_mesh_t mesh({p, n, 1});
        const int stage = mesh.coords()[0];
        // Stage s: n x 1 for even s, n/2 x 2 for odd s (when n is even).
        const std::array<int, 2> sizes =
            stage % 2 == 1 && n % 2 == 0 ? std::array<int, 2>{n / 2, 2} : std::array<int, 2>{n, 1};
        const stage_mesh_t stage_mesh(mesh.sub(full_mesh_t::axes<"dp", "tp">()), sizes);
        const int last_dp = (p - 1) % 2 == 1 && n % 2 == 0 ? n / 2 : n;
        const std::size_t rows = std::size_t(2 * p * n * 2); // a multiple of n x m
        const auto b = make_batch(rows, 17);
        const auto [expected_loss, expected] = one_rank(b);
        const auto x = xshard::distribute<xshard::dynamic_layout(2)>(stage_mesh, b.x,
                                                                     nn::make_layout({"dp", ""}));
        // With pp 2 the last stage takes its input whole: its labels are whole too, and
        // cut like the batch's n row blocks.
        const auto y = xshard::distribute<xshard::dynamic_layout(1)>(
            stage_mesh, b.y, nn::make_layout({p == 2 ? "" : "dp"}));
        const std::vector<std::size_t> starts =
            p == 2 ? std::vector<std::size_t>{4}
                   : (p == 3 ? std::vector<std::size_t>{3, 6} : std::vector<std::size_t>{2, 4, 6});
        std::map<int, xshard::layout> inputs;
        if (p == 2)
            inputs[1] = nn::make_layout({"", ""}); // stage 1 takes its input whole
        for (auto kind : {pp::schedule_kind::gpipe, pp::schedule_kind::one_f_one_b,
                          pp::schedule_kind::zero_bubble}) {
            const std::string where = "pp=" + std::to_string(p) + " n=" + std::to_string(n) +
                                      " last dp=" + std::to_string(last_dp) + ", " +
                                      std::string(pp::name(kind)) + ", rank " +
                                      std::to_string(mesh.rank());
            auto model = make_model(stage_mesh);
            nn::parallel_cross_entropy<double, stage_mesh_t> loss;
            pp::pipeline<decltype(model), X> pipe(mesh, "pp", stage_mesh, model,
                                                  {.micro_batches = 2 * p,
                                                   .scheduler = kind,
                                                   .stage_starts = starts,
                                                   .output_broadcast = true,
                                                   .stage_input_layouts = inputs});
            const double value = pipe.step(x, y, loss);
            pipe.synchronize_gradients();
            EXPECT_NEAR(value, expected_loss, 1e-12) << where;
            int checked = 0;
            xshard::for_each_weight(pipe.local_parameters(), [&](const std::string& name, auto& w) {
                const xt::xarray<double> g = xshard::gather_all(xshard::ops::resolve(w.grad));
                EXPECT_TRUE(xt::allclose(g, expected.at(name), 1e-12, 1e-12))
                    << name << ", " << where;
                ++checked;
            });
            int total = checked;
            xshard::mpi::allreduce(mesh.sub<"pp">(), std::span(&total, 1), xshard::reduction::sum);
            EXPECT_EQ(total, int(expected.size())) << where;
        }
    }
}

/// The one-rank model's output (the logits) for `b`.
xt::xarray<double> one_rank_output(const batch& b) {
    const stage_mesh_t one(xshard::communicator::self(), {1, 1});
    auto model = make_model(one);
    const auto x =
        xshard::distribute<xshard::dynamic_layout(2)>(one, b.x, nn::make_layout({"", ""}));
    return xshard::gather_all(xshard::ops::resolve(model.forward(x)));
}

/// Pipelined inference (MindSpore's output_broadcast): for every factorisation and
/// schedule, with the batch's rows split over dp or whole, `predict` gives the one-rank
/// output on the last stage, and on every stage with output_broadcast, on meshes of one shape
/// and of different shapes (a cross-mesh broadcast), for batches of any size. Each stage
/// reads only its own weights:
/// the modules of other stages hold NaN on each rank, and the output is still exact. The
/// gradients stay zero terms.
TEST(pipeline, predict_equals_one_rank_and_reads_only_the_stage_s_weights) {
    const int world = xshard::testing::world().size();
    const auto poison_others = [](auto& model, const auto& pipe) {
        visit_parameters(model, [&](std::string_view name, auto& child) {
            if (!pipe.local_modules().count(std::string(name)))
                xshard::for_each_weight(child, [](const std::string&, auto& w) {
                    w.value.local().fill(std::numeric_limits<double>::quiet_NaN());
                });
        });
    };
    for (const auto& sizes : meshes(world)) {
        const full_mesh_t mesh(sizes);
        const auto stage_mesh = pp::stage_mesh_of<stage_mesh_t>(mesh);
        const int p = sizes[0], dp = sizes[1];
        const int m = 2 * p;
        const auto b = make_batch(std::size_t(m * dp * 2 + 1), 29);
        const auto expected = one_rank_output(b);
        std::vector<std::pair<pp::schedule_kind, int>> runs{{pp::schedule_kind::one_f_one_b, 1},
                                                            {pp::schedule_kind::zero_bubble, 1}};
        if (p * 2 <= 9)
            runs.emplace_back(pp::schedule_kind::interleaved, 2);
        for (const char* rows : {"dp", ""})
            for (const auto& [kind, v] : runs)
                for (const bool broadcast : {true, false}) {
                    const std::string where =
                        "mesh pp=" + std::to_string(p) + " dp=" + std::to_string(dp) +
                        " tp=" + std::to_string(sizes[2]) + ", rows [" + rows + "], " +
                        std::string(pp::name(kind)) + " v=" + std::to_string(v) +
                        (broadcast ? ", broadcast" : "") + ", rank " + std::to_string(mesh.rank());
                    const auto x = xshard::distribute<xshard::dynamic_layout(2)>(
                        stage_mesh, b.x, nn::make_layout({rows, ""}));
                    auto model = make_model(stage_mesh);
                    pp::pipeline<decltype(model), X> pipe(mesh, "pp", stage_mesh, model,
                                                          {.micro_batches = m,
                                                           .scheduler = kind,
                                                           .virtual_stages = v,
                                                           .output_broadcast = broadcast});
                    poison_others(model, pipe);
                    const auto y = pipe.predict(x);
                    const bool last = pipe.stage() == p - 1;
                    ASSERT_EQ(y.has_value(), broadcast || last) << where;
                    if (y) {
                        EXPECT_EQ(y->layout().split_count(0, stage_mesh.shape()),
                                  x.layout().split_count(0, stage_mesh.shape()))
                            << where;
                        const xt::xarray<double> got = xshard::gather_all(xshard::ops::resolve(*y));
                        EXPECT_TRUE(xt::allclose(got, expected, 1e-12, 1e-12)) << where;
                    }
                    xshard::for_each_weight(
                        pipe.local_parameters(), [&](const std::string& name, auto& w) {
                            const xt::xarray<double> g =
                                xshard::gather_all(xshard::ops::resolve(w.grad));
                            EXPECT_TRUE(xt::all(xt::equal(g, 0.0))) << name << ", " << where;
                        });
                }
        // A batch of any size: 5 rows take as many micro-batches as cut them.
        const auto small = make_batch(5, 37);
        auto model = make_model(stage_mesh);
        pp::pipeline<decltype(model), X> pipe(mesh, "pp", stage_mesh, model,
                                              {.micro_batches = m, .output_broadcast = true});
        const auto y = pipe.predict(xshard::distribute<xshard::dynamic_layout(2)>(
            stage_mesh, small.x, nn::make_layout({"dp", ""})));
        EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::resolve(*y)),
                                 one_rank_output(small), 1e-12, 1e-12))
            << "5 rows, pp=" << p << " dp=" << dp << ", rank " << mesh.rank();
    }
    // Stages on meshes of different shapes (n x 1, then n/2 x 2), the last taking its input
    // whole: its output's rows are whole, joined from micro-batches cut from n row blocks,
    // and reach the first stage through a cross-mesh plan.
    const int p = world % 4 == 0 ? 2 : 0; // n = world / 2 even
    if (p == 0)
        return;
    const int n = world / p;
    const full_mesh_t mesh({p, n, 1});
    const std::array<int, 2> sizes =
        mesh.coords()[0] == 1 ? std::array<int, 2>{n / 2, 2} : std::array<int, 2>{n, 1};
    const stage_mesh_t stage_mesh(mesh.sub(full_mesh_t::axes<"dp", "tp">()), sizes);
    const auto b = make_batch(std::size_t(4 * n), 31);
    const auto expected = one_rank_output(b);
    const auto x =
        xshard::distribute<xshard::dynamic_layout(2)>(stage_mesh, b.x, nn::make_layout({"dp", ""}));
    auto model = make_model(stage_mesh);
    pp::pipeline<decltype(model), X> pipe(
        mesh, "pp", stage_mesh, model,
        {.micro_batches = 2,
         .stage_starts = {4},
         .output_broadcast = true,
         .stage_input_layouts = {{1, nn::make_layout({"", ""})}}});
    poison_others(model, pipe);
    const auto y = pipe.predict(x);
    ASSERT_TRUE(y.has_value());
    EXPECT_EQ(y->mesh().shape().sizes[1], sizes[1]);
    EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::resolve(*y)), expected, 1e-12, 1e-12))
        << "cross-mesh broadcast, rank " << mesh.rank();
}

/// Only the first stage passes the batch and only the last the labels (the others pass
/// null): the step equals the one-rank run; a missing batch raises on every rank.
TEST(pipeline, each_stage_reads_only_its_data) {
    using xshard::testing::expect_error;
    const int world = xshard::testing::world().size();
    const int p = world % 2 == 0 ? 2 : 1;
    const full_mesh_t mesh({p, world / p, 1});
    const auto stage_mesh = pp::stage_mesh_of<stage_mesh_t>(mesh);
    const auto b = make_batch(std::size_t(8 * (world / p)), 23);
    const auto [expected_loss, expected] = one_rank(b);
    auto model = make_model(stage_mesh);
    nn::parallel_cross_entropy<double, stage_mesh_t> loss;
    pp::pipeline<decltype(model), X> pipe(mesh, "pp", stage_mesh, model,
                                          {.micro_batches = 4, .output_broadcast = true});
    std::optional<X> x;
    std::optional<labels_t> y;
    if (pipe.reads_inputs())
        x = xshard::distribute<xshard::dynamic_layout(2)>(stage_mesh, b.x,
                                                          nn::make_layout({"dp", ""}));
    if (pipe.reads_labels())
        y = xshard::distribute<xshard::dynamic_layout(1)>(stage_mesh, b.y, nn::make_layout({"dp"}));
    EXPECT_EQ(pipe.reads_inputs(), pipe.stage() == 0);
    EXPECT_EQ(pipe.reads_labels(), pipe.stage() == p - 1);
    const double value = pipe.step(x ? &*x : nullptr, y ? &*y : nullptr, loss);
    pipe.synchronize_gradients();
    EXPECT_NEAR(value, expected_loss, 1e-12);
    xshard::for_each_weight(pipe.local_parameters(), [&](const std::string& name, auto& w) {
        const xt::xarray<double> g = xshard::gather_all(xshard::ops::resolve(w.grad));
        EXPECT_TRUE(xt::allclose(g, expected.at(name), 1e-12, 1e-12)) << name;
    });
    expect_error([&] { pipe.step(static_cast<const X*>(nullptr), y ? &*y : nullptr, loss); },
                 "the first stage needs the batch");
}

/// One integrated checkpoint of every stage (pipeline/checkpoint.hpp): a trained pipeline
/// (pp x dp) saves it collectively; it loads into the model on one mesh of every rank and on
/// one rank (another world size) with the ordinary load_checkpoint, into pipelines of every
/// factorisation pp x dp x tp of the world (other stage counts, stage meshes, the default
/// cut) and one cut otherwise, and into stages on differently shaped meshes, whose own
/// checkpoint (parameters with meshes of their own) loads back into one mesh. The one-mesh
/// model's checkpoint loads into a pipeline. A save that fails on one rank (a file size
/// limit) raises on every rank and leaves the previous checkpoint loadable. Every loaded
/// weight equals the one-rank step's (init - lr x gradient).
TEST(pipeline, one_integrated_checkpoint_loads_into_any_strategy) {
    using xshard::testing::expect_error;
    const auto world_comm = xshard::testing::world();
    const int world = world_comm.size();
    const int p = world % 2 == 0 ? 2 : (world == 3 ? 3 : 1);
    const full_mesh_t mesh({p, world / p, 1});
    const auto stage_mesh = pp::stage_mesh_of<stage_mesh_t>(mesh);
    const auto b = make_batch(std::size_t(8 * (world / p)), 29);
    const auto [expected_loss, grads] = one_rank(b);
    // The one-rank weights after one SGD step.
    std::map<std::string, xt::xarray<double>> expected;
    {
        const stage_mesh_t one(xshard::communicator::self(), {1, 1});
        auto init = make_model(one);
        xshard::for_each_weight(init, [&](const std::string& name, auto& w) {
            expected[name] = xshard::gather_all(w.value) - 0.1 * grads.at(name);
        });
    }
    const auto check = [&](auto& params, const std::string& what) {
        int checked = 0;
        xshard::for_each_weight(params, [&](const std::string& name, auto& w) {
            const xt::xarray<double> v = xshard::gather_all(w.value);
            EXPECT_TRUE(xt::allclose(v, expected.at(name), 1e-12, 1e-12))
                << name << ", " << what << ", rank " << world_comm.rank();
            ++checked;
        });
        return checked;
    };
    // Every weight is checked once per pipeline (on its stage).
    const auto check_pipe = [&](auto& pipe, const auto& full, const std::string& what) {
        int total = check(pipe.local_parameters(), what);
        xshard::mpi::allreduce(full.template sub<"pp">(), std::span(&total, 1),
                               xshard::reduction::sum);
        EXPECT_EQ(total, int(expected.size())) << what;
    };
    const auto dir = xshard::testing::shared_directory(world_comm, "/tmp");
    const auto path = dir + "/pipe.safetensors";
    auto model = make_model(stage_mesh);
    nn::parallel_cross_entropy<double, stage_mesh_t> loss;
    {
        pp::pipeline<decltype(model), X> pipe(mesh, "pp", stage_mesh, model, {.micro_batches = 2});
        const auto x = xshard::distribute<xshard::dynamic_layout(2)>(stage_mesh, b.x,
                                                                     nn::make_layout({"dp", ""}));
        const auto y =
            xshard::distribute<xshard::dynamic_layout(1)>(stage_mesh, b.y, nn::make_layout({"dp"}));
        pipe.step(x, y, loss);
        pipe.synchronize_gradients();
        xshard::optim::sgd({.lr = 0.1}).step(pipe.local_parameters());
        check(pipe.local_parameters(), "trained");
        pp::save_pipeline_checkpoint(path, pipe, {.step = 1});
        pp::save_pipeline_strategy_file(dir + "/pipe.strategy.json", pipe);
        // The strategy file: every parameter once, with its stage (the one running it).
        const auto f = xshard::load_strategy_file(dir + "/pipe.strategy.json");
        EXPECT_EQ(f.pipeline_stages, p);
        EXPECT_EQ(f.parameters.size(), expected.size());
        for (const auto& [module, stage] : pipe.stages())
            for (const auto& e : f.parameters)
                if (e.name.rfind(module + ".", 0) == 0) {
                    EXPECT_EQ(e.stage, stage) << e.name;
                    EXPECT_FALSE(e.mesh) << e.name << ": every stage has one mesh shape";
                }
        // One file: no per-stage files beside it.
        EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 2);
        // A save that fails where it writes (a file size limit on every rank: EFBIG) raises
        // on every rank and leaves the previous checkpoint. (Which ranks write which bytes
        // is the save's choice: these small tensors the node writes together, rank 0 all of
        // them, so a limit on one other rank would meet no write.)
        ::signal(SIGXFSZ, SIG_IGN);
        rlimit saved{};
        ::getrlimit(RLIMIT_FSIZE, &saved);
        rlimit small = saved;
        small.rlim_cur = 16;
        ::setrlimit(RLIMIT_FSIZE, &small);
        expect_error([&] { pp::save_pipeline_checkpoint(path, pipe, {.step = 2}); }, "");
        ::setrlimit(RLIMIT_FSIZE, &saved);
        xshard::mpi::barrier(world_comm);
        EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 2)
            << "a failed save left a temporary";
    }
    // Into the model on one mesh of every rank (dp x tp = world x 1), and on one rank.
    {
        const stage_mesh_t whole_mesh(world_comm, {world, 1});
        auto whole = make_model(whole_mesh);
        const auto info = xshard::load_checkpoint(path, whole);
        EXPECT_EQ(info.step, 1);
        EXPECT_EQ(check(whole, "into one mesh"), int(expected.size()));
        const stage_mesh_t one(xshard::communicator::self(), {1, 1});
        auto single = make_model(one);
        xshard::load_checkpoint(path, single);
        EXPECT_EQ(check(single, "into one rank"), int(expected.size()));
        // And back: the one-mesh model's checkpoint into a pipeline.
        xshard::save_checkpoint(dir + "/whole.safetensors", whole);
        auto fresh = make_model(stage_mesh);
        pp::pipeline<decltype(fresh), X> back(mesh, "pp", stage_mesh, fresh, {.micro_batches = 2});
        pp::load_pipeline_checkpoint(dir + "/whole.safetensors", back);
        check_pipe(back, mesh, "one-mesh checkpoint into a pipeline");
    }
    // Into pipelines of every factorisation (pp up to 4, tp up to 2), and one cut otherwise.
    for (const auto& sizes : meshes(world)) {
        const full_mesh_t other_mesh(sizes);
        const auto other_stage = pp::stage_mesh_of<stage_mesh_t>(other_mesh);
        const std::string what = "into pp=" + std::to_string(sizes[0]) +
                                 " dp=" + std::to_string(sizes[1]) +
                                 " tp=" + std::to_string(sizes[2]);
        auto fresh = make_model(other_stage);
        pp::pipeline<decltype(fresh), X> other(other_mesh, "pp", other_stage, fresh,
                                               {.micro_batches = 2});
        const auto info = pp::load_pipeline_checkpoint(path, other);
        EXPECT_EQ(info.step, 1) << what;
        check_pipe(other, other_mesh, what);
        if (sizes[0] == 2) {
            auto cut = make_model(other_stage);
            pp::pipeline<decltype(cut), X> again(other_mesh, "pp", other_stage, cut,
                                                 {.micro_batches = 2, .stage_starts = {2}});
            pp::load_pipeline_checkpoint(path, again);
            check_pipe(again, other_mesh, what + ", another cut");
        }
    }
    // Stages on differently shaped meshes (n x 1, then n/2 x 2): load, save, load into one
    // mesh. The second stage's parameters are stored with a mesh of their own.
    if (world % 4 == 0) {
        const int n = world / 2;
        const full_mesh_t two({2, n, 1});
        const std::array<int, 2> shape =
            two.coords()[0] == 1 ? std::array<int, 2>{n / 2, 2} : std::array<int, 2>{n, 1};
        const stage_mesh_t odd(two.sub(full_mesh_t::axes<"dp", "tp">()), shape);
        auto fresh = make_model(odd);
        pp::pipeline<decltype(fresh), X> mixed(two, "pp", odd, fresh, {.micro_batches = 2});
        pp::load_pipeline_checkpoint(path, mixed);
        check_pipe(mixed, two, "into stages on differently shaped meshes");
        pp::save_pipeline_checkpoint(dir + "/mixed.safetensors", mixed, {.step = 5});
        const auto s = pp::pipeline_strategy(mixed);
        int own = 0;
        for (const auto& e : s.parameters)
            own += e.mesh.has_value() && e.stage == 1;
        EXPECT_GT(own, 0);
        const stage_mesh_t whole_mesh(world_comm, {n, 2});
        auto whole = make_model(whole_mesh);
        EXPECT_EQ(xshard::load_checkpoint(dir + "/mixed.safetensors", whole).step, 5);
        EXPECT_EQ(check(whole, "from stages on differently shaped meshes"), int(expected.size()));
    }
    int done = 1; // every rank has read before rank 0 removes the directory
    xshard::mpi::allreduce(world_comm, std::span(&done, 1), xshard::reduction::sum);
    if (world_comm.rank() == 0)
        std::filesystem::remove_all(dir);
}

/// Every weight's value and Adam state of `params` gathered whole, by name (the state under
/// "optimizer.", as checkpoints name it). Collective over each tensor's mesh.
template <class P>
std::map<std::string, xt::xarray<double>> contents(P& params, const xshard::optim::adam& opt) {
    std::map<std::string, xt::xarray<double>> out;
    xshard::for_each_weight(
        params, [&](const std::string& name, auto& w) { out[name] = xshard::gather_all(w.value); });
    auto state = opt.state_of(params);
    xshard::for_each_parameter(state, [&](const std::string& name, auto& t) {
        out["optimizer." + name] = xshard::gather_all(t);
    });
    return out;
}

/// Optimizer state sharded over part of each stage's dp axis (hsdp shard_size 2: copies of 2
/// consecutive ranks, each holding the state on its own mesh; 2 stages x dp 4 at 8 ranks,
/// one stage of dp 4 or 6 at 4 and 6) saves into one pipeline checkpoint whose strategy gives
/// each state tensor its copy's mesh and the pipeline's ranks of the copy that wrote it, and
/// which loads exactly into the same pipeline (which then trains on as the saving one), a
/// model on one rank and one on every rank without sharding, and a pipeline of another stage
/// count at level2. Where dp has no proper part (1, 2, 3 ranks) the state is sharded over the
/// whole dp (shard_size -1) and goes the same ways.
TEST(pipeline, optimizer_state_sharded_over_part_of_a_stage_loads_anywhere) {
    const auto world_comm = xshard::testing::world();
    const int world = world_comm.size(), rank = world_comm.rank();
    const int p = world == 8 ? 2 : 1, dp = world / p;
    const int shard = dp >= 4 && dp % 2 == 0 ? 2 : -1;
    const full_mesh_t mesh({p, dp, 1});
    const auto stage_mesh = pp::stage_mesh_of<stage_mesh_t>(mesh);
    const xshard::optim::adam_options o{.lr = 0.01};
    const auto b = make_batch(std::size_t(8 * dp), 31), b2 = make_batch(std::size_t(8 * dp), 37);
    const auto inputs = [&](const stage_mesh_t& m, const batch& d) {
        return std::pair{
            xshard::distribute<xshard::dynamic_layout(2)>(m, d.x, nn::make_layout({"dp", ""})),
            xshard::distribute<xshard::dynamic_layout(1)>(m, d.y, nn::make_layout({"dp"}))};
    };
    // The one-rank run: the weights and Adam's state after one step.
    const stage_mesh_t one(xshard::communicator::self(), {1, 1});
    std::map<std::string, xt::xarray<double>> expected;
    {
        auto model = make_model(one);
        nn::parallel_cross_entropy<double, stage_mesh_t> loss;
        const auto [x, y] = inputs(one, b);
        loss.forward(model.forward(x), y);
        model.backward(loss.backward());
        xshard::optim::adam opt(o);
        opt.step(model);
        expected = contents(model, opt);
    }
    // `got` equals `want` where both have a name (exactly when tol is 0); returns the count.
    const auto compare = [&](const auto& got, const auto& want, double tol,
                             const std::string& what) {
        int n = 0;
        for (const auto& [name, v] : got) {
            const auto it = want.find(name);
            if (it == want.end()) {
                ADD_FAILURE() << name << " missing, " << what << ", rank " << rank;
                continue;
            }
            EXPECT_TRUE(tol == 0 ? v == it->second : xt::allclose(v, it->second, tol, tol))
                << name << ", " << what << ", rank " << rank;
            ++n;
        }
        return n;
    };
    const auto dir = xshard::testing::shared_directory(world_comm, "/tmp");
    const auto path = dir + "/sharded.safetensors";
    const std::string config = "pp=" + std::to_string(p) + " dp=" + std::to_string(dp) +
                               " shard_size=" + std::to_string(shard);
    std::map<std::string, xt::xarray<double>> saved; // this rank's stage's, as saved
    auto model = make_model(stage_mesh), again = make_model(stage_mesh);
    {
        nn::parallel_cross_entropy<double, stage_mesh_t> loss;
        pp::pipeline<decltype(model), X> pipe(mesh, "pp", stage_mesh, model, {.micro_batches = 2});
        using view_t = std::remove_reference_t<decltype(pipe.local_parameters())>;
        xshard::hsdp<view_t> sharding(pipe.local_parameters(),
                                      {.shard_size = shard, .threshold = 0});
        xshard::for_each_weight(pipe.local_parameters(), [&](const std::string& name, auto& w) {
            if (dp == 1)
                return;
            ASSERT_TRUE(w.shard) << name << ", " << config;
            EXPECT_EQ(w.shard->value.mesh().size(), shard > 0 ? shard : dp) << name;
        });
        xshard::optim::adam opt(o);
        {
            const auto [x, y] = inputs(stage_mesh, b);
            pipe.step(x, y, loss);
            sharding.synchronize_gradients();
            sharding.step(opt);
        }
        saved = contents(pipe.local_parameters(), opt);
        EXPECT_GT(compare(saved, expected, 1e-12, "trained, " + config), 0);
        pp::save_pipeline_checkpoint(path, pipe, {.step = 1},
                                     opt.state_of(pipe.local_parameters()));
        // The state's entries: with a copy's mesh and the pipeline's ranks of the copy that
        // holds its stage mesh's rank 0 (stage s's dp coordinates 0 .. shard - 1).
        const auto f = xshard::checkpoint_reader(path).strategy();
        EXPECT_EQ(f.pipeline_stages, p);
        EXPECT_EQ(f.parameters.size(), expected.size());
        int copies = 0;
        for (const auto& e : f.parameters) {
            if (!e.name.starts_with("optimizer.") || shard < 0) {
                EXPECT_FALSE(e.mesh) << e.name << ", " << config;
                EXPECT_TRUE(e.ranks.empty()) << e.name << ", " << config;
                continue;
            }
            ASSERT_TRUE(e.mesh) << e.name;
            EXPECT_EQ(e.mesh->size(), shard) << e.name;
            ASSERT_EQ(e.ranks.size(), std::size_t(shard)) << e.name;
            for (int k = 0; k < shard; ++k)
                EXPECT_EQ(e.ranks[std::size_t(k)], e.stage * dp + k) << e.name << ", " << config;
            ++copies;
        }
        EXPECT_EQ(copies, shard > 0 ? int(expected.size()) * 2 / 3 : 0) << config;

        // (a) The same pipeline: the same contents exactly, then one more step as the saver.
        pp::pipeline<decltype(again), X> same(mesh, "pp", stage_mesh, again, {.micro_batches = 2});
        xshard::hsdp<view_t> resharded(same.local_parameters(),
                                       {.shard_size = shard, .threshold = 0});
        xshard::optim::adam resumed(o);
        const auto info =
            pp::load_pipeline_checkpoint(path, same, resumed.state_of(same.local_parameters()));
        EXPECT_EQ(info.step, 1);
        resumed.set_steps(info.step);
        EXPECT_EQ(compare(contents(same.local_parameters(), resumed), saved, 0,
                          "into the same pipeline, " + config),
                  int(saved.size()));
        const auto [x, y] = inputs(stage_mesh, b2);
        pipe.zero_grad();
        pipe.step(x, y, loss);
        sharding.synchronize_gradients();
        sharding.step(opt);
        nn::parallel_cross_entropy<double, stage_mesh_t> loss2;
        same.step(x, y, loss2);
        resharded.synchronize_gradients();
        resharded.step(resumed);
        EXPECT_EQ(compare(contents(same.local_parameters(), resumed),
                          contents(pipe.local_parameters(), opt), 1e-12,
                          "a step after loading, " + config),
                  int(saved.size()));
    }
    // (b) A model on one rank and one on every rank, neither sharded: the stored values are
    // the saved ones exactly (the one-rank run's to 1e-12).
    std::map<std::string, xt::xarray<double>> stored;
    {
        auto single = make_model(one);
        xshard::optim::adam opt(o);
        EXPECT_EQ(xshard::load_checkpoint(path, single, opt.state_of(single)).step, 1);
        stored = contents(single, opt);
        EXPECT_EQ(compare(stored, expected, 1e-12, "into one rank, " + config),
                  int(expected.size()));
        EXPECT_EQ(compare(saved, stored, 0, "saved and stored, " + config), int(saved.size()));
        const stage_mesh_t whole_mesh(world_comm, {world, 1});
        auto whole = make_model(whole_mesh);
        xshard::optim::adam opt_whole(o);
        xshard::load_checkpoint(path, whole, opt_whole.state_of(whole));
        EXPECT_EQ(compare(contents(whole, opt_whole), stored, 0, "into one mesh, " + config),
                  int(expected.size()));
    }
    // (c) A pipeline of another stage count (2 stages where the saver had 1, else 1; 3 on 3
    // ranks) at level2 over the whole dp: each weight and its state once, exactly.
    {
        const int q = world % 2 == 0 ? (p == 1 ? 2 : 1) : world;
        const full_mesh_t other_mesh({q, world / q, 1});
        const auto other_stage = pp::stage_mesh_of<stage_mesh_t>(other_mesh);
        auto fresh = make_model(other_stage);
        pp::pipeline<decltype(fresh), X> other(other_mesh, "pp", other_stage, fresh,
                                               {.micro_batches = 2});
        using view_t = std::remove_reference_t<decltype(other.local_parameters())>;
        xshard::hsdp<view_t> level2(
            other.local_parameters(),
            {.threshold = 0, .optimizer_level = xshard::optimizer_level::level2});
        xshard::optim::adam opt(o);
        EXPECT_EQ(
            pp::load_pipeline_checkpoint(path, other, opt.state_of(other.local_parameters())).step,
            1);
        int total = compare(contents(other.local_parameters(), opt), stored, 0,
                            "into pp=" + std::to_string(q) + " at level2, " + config);
        xshard::mpi::allreduce(other_mesh.sub<"pp">(), std::span(&total, 1),
                               xshard::reduction::sum);
        EXPECT_EQ(total, int(expected.size())) << config;
    }
    int done = 1; // every rank has read before rank 0 removes the directory
    xshard::mpi::allreduce(world_comm, std::span(&done, 1), xshard::reduction::sum);
    if (rank == 0)
        std::filesystem::remove_all(dir);
}

/// MindSpore's parameter_broadcast with pipeline_stages and initial_rank applies per stage:
/// every rank's weights start as its world rank; afterwards each stage's data-parallel
/// copies hold one owner's values, and that owner is a rank of the same stage. An
/// initial_rank that is not the stage's first rank raises on every rank of the stage.
TEST(pipeline, parameter_broadcast_applies_per_stage) {
    using xshard::testing::expect_error;
    const auto world_comm = xshard::testing::world();
    const int world = world_comm.size();
    const int p = world % 2 == 0 ? 2 : (world == 3 ? 3 : 1), n = world / p;
    const full_mesh_t mesh({p, n, 1});
    const auto stage_mesh = pp::stage_mesh_of<stage_mesh_t>(mesh);
    auto model = make_model(stage_mesh);
    pp::pipeline<decltype(model), X> pipe(mesh, "pp", stage_mesh, model, {.micro_batches = p});
    const int stage = pipe.stage();
    ASSERT_EQ(world_comm.rank() / n, stage) << "the stages are consecutive world ranks";
    xshard::for_each_weight(pipe.local_parameters(), [&](const std::string&, auto& w) {
        w.value.local().fill(double(world_comm.rank()));
    });
    xshard::parameter_broadcast(pipe.local_parameters(),
                                {.initial_rank = stage * n, .pipeline_stages = p});
    int checked = 0;
    xshard::for_each_weight(pipe.local_parameters(), [&](const std::string& name, auto& w) {
        const auto& local = w.value.local();
        ASSERT_GT(local.size(), 0u) << name;
        const double v = *local.begin();
        EXPECT_EQ(int(v) / n, stage) << name << ": the owner is on another stage";
        std::array<double, 2> range{v, -v};
        xshard::mpi::allreduce(stage_mesh.sub<"dp">(), std::span(range), xshard::reduction::max);
        EXPECT_EQ(range[0], -range[1]) << name << ": the data-parallel copies differ";
        ++checked;
    });
    EXPECT_GT(checked, 0);
    if (p > 1 && stage > 0)
        expect_error(
            [&] {
                xshard::parameter_broadcast(pipe.local_parameters(),
                                            {.initial_rank = 0, .pipeline_stages = p});
            },
            "is not the first rank");
}

TEST(pipeline, boundary_misuse_raises_on_every_rank) {
    using xshard::testing::expect_error;
    const int world = xshard::testing::world().size();
    if (world % 2 != 0)
        return;
    const full_mesh_t mesh({2, world / 2, 1});
    const auto stage_mesh = pp::stage_mesh_of<stage_mesh_t>(mesh);
    auto model = make_model(stage_mesh);
    using pipe_t = pp::pipeline<decltype(model), X>;
    expect_error(
        [&] {
            pipe_t(mesh, "pp", stage_mesh, model,
                   {.micro_batches = 2, .stage_input_layouts = {{1, xshard::layout("[-, sp]")}}});
        },
        "the input layout [-, sp] of stage 1 does not fit its mesh(dp=");
    expect_error(
        [&] {
            pipe_t(mesh, "pp", stage_mesh, model,
                   {.micro_batches = 2, .stage_input_layouts = {{0, xshard::layout("[-, -]")}}});
        },
        "stage_input_layouts names stage 0; stages 1 to 1 receive inputs");
    expect_error(
        [&] {
            pipe_t(mesh, "pp", stage_mesh, model,
                   {.micro_batches = 2,
                    .stage_input_layouts = {{1, xshard::layout("[-, -] partial(sum: dp)")}}});
        },
        "has a pending reduction");
    // Whole labels are cut like the batch's n row blocks, which needs a multiple of n rows:
    // the last stage finds out, every rank raises.
    const int n = world / 2;
    if (n >= 2) {
        pipe_t pipe(mesh, "pp", stage_mesh, model, {.micro_batches = 2});
        nn::parallel_cross_entropy<double, stage_mesh_t> loss;
        const auto b = make_batch(std::size_t(4 * n + 1), 1);
        const auto x = xshard::distribute<xshard::dynamic_layout(2)>(stage_mesh, b.x,
                                                                     nn::make_layout({"dp", ""}));
        const auto y =
            xshard::distribute<xshard::dynamic_layout(1)>(stage_mesh, b.y, nn::make_layout({""}));
        expect_error([&] { pipe.step(x, y, loss); },
                     "rows cut as " + std::to_string(n) + " row blocks");
    }
    // One row per block in two micro-batches: the second would hold no row. Every rank
    // raises.
    {
        pipe_t pipe(mesh, "pp", stage_mesh, model, {.micro_batches = 2});
        nn::parallel_cross_entropy<double, stage_mesh_t> loss;
        const auto b = make_batch(std::size_t(world / 2), 2);
        const auto x = xshard::distribute<xshard::dynamic_layout(2)>(stage_mesh, b.x,
                                                                     nn::make_layout({"dp", ""}));
        const auto y =
            xshard::distribute<xshard::dynamic_layout(1)>(stage_mesh, b.y, nn::make_layout({"dp"}));
        expect_error([&] { pipe.step(x, y, loss); }, "does not cut into 2 micro-batches");
    }
}

TEST(pipeline, second_step_reuses_slots_and_accumulates) {
    const int world = xshard::testing::world().size();
    const int p = world % 2 == 0 ? 2 : 1;
    const full_mesh_t mesh({p, world / p, 1});
    const auto stage_mesh = pp::stage_mesh_of<stage_mesh_t>(mesh);
    const auto b = make_batch(std::size_t(8 * (world / p)), 5);
    const auto [expected_loss, expected] = one_rank(b);
    const auto x =
        xshard::distribute<xshard::dynamic_layout(2)>(stage_mesh, b.x, nn::make_layout({"dp", ""}));
    const auto y =
        xshard::distribute<xshard::dynamic_layout(1)>(stage_mesh, b.y, nn::make_layout({"dp"}));
    auto model = make_model(stage_mesh);
    nn::parallel_cross_entropy<double, stage_mesh_t> loss;
    pp::pipeline<decltype(model), X> pipe(
        mesh, "pp", stage_mesh, model,
        {.micro_batches = 4, .scheduler = pp::schedule_kind::one_f_one_b});
    pipe.step(x, y, loss);
    const double second = pipe.step(x, y, loss); // gradients add up: twice the one-rank's
    pipe.synchronize_gradients();
    if (pipe.stage() == p - 1) {
        EXPECT_NEAR(second, expected_loss, 1e-12);
    } else {
        EXPECT_TRUE(std::isnan(second)); // no output_broadcast
    }
    xshard::for_each_weight(pipe.local_parameters(), [&](const std::string& name, auto& w) {
        const xt::xarray<double> g = xshard::gather_all(xshard::ops::resolve(w.grad));
        EXPECT_TRUE(xt::allclose(g, 2.0 * expected.at(name), 1e-12, 1e-12)) << name;
    });
    pipe.zero_grad();
    pipe.step(x, y, loss);
    pipe.synchronize_gradients();
    xshard::for_each_weight(pipe.local_parameters(), [&](const std::string& name, auto& w) {
        const xt::xarray<double> g = xshard::gather_all(xshard::ops::resolve(w.grad));
        EXPECT_TRUE(xt::allclose(g, expected.at(name), 1e-12, 1e-12)) << name;
    });
}

TEST(pipeline, stage_assignment) {
    const std::vector<std::string> names{"flatten", "layer1", "relu1", "layer2", "relu2", "layer3"};
    EXPECT_EQ(pp::stages_by_name(names,
                                 {{"flatten", 0},
                                  {"layer1", 0},
                                  {"relu1", 0},
                                  {"layer2", 1},
                                  {"relu2", 1},
                                  {"layer3", 1}},
                                 2),
              (std::vector<int>{0, 0, 0, 1, 1, 1}));
    EXPECT_EQ(pp::stages_by_name(names, {{"layer2", 1}}, 2), (std::vector<int>{0, 0, 0, 1, 1, 1}));
    // MindSpore's own form, with the WithLossCell prefix.
    EXPECT_EQ(pp::stages_by_name(names,
                                 {{"_backbone.flatten", 0},
                                  {"_backbone.layer1", 0},
                                  {"_backbone.relu1", 0},
                                  {"_backbone.layer2", 1},
                                  {"_backbone.relu2", 1},
                                  {"_backbone.layer3", 1}},
                                 2),
              (std::vector<int>{0, 0, 0, 1, 1, 1}));
    EXPECT_EQ(pp::stages_by_name(
                  names, {{"_backbone", 0}, {"_backbone.relu2", 1}, {"_backbone.layer3", 1}}, 2),
              (std::vector<int>{0, 0, 0, 0, 1, 1}));
    // Paths at any depth: an ancestor gives its modules a stage, the most specific path
    // wins, and a part of a module gives the module its stage.
    const std::vector<std::string> nested{"backbone.layer1", "backbone.layer2", "head.dense",
                                          "head.relu"};
    EXPECT_EQ(pp::stages_by_name(nested, {{"backbone", 0}, {"head", 1}}, 2),
              (std::vector<int>{0, 0, 1, 1}));
    EXPECT_EQ(pp::stages_by_name(nested, {{"_backbone.backbone", 0}, {"_backbone.head", 1}}, 2),
              (std::vector<int>{0, 0, 1, 1}));
    EXPECT_EQ(pp::stages_by_name(nested, {{"backbone", 0}, {"backbone.layer2", 1}, {"head", 2}}, 3),
              (std::vector<int>{0, 1, 2, 2}));
    EXPECT_EQ(pp::stages_by_name(nested, {{"head.dense.weight", 1}}, 2),
              (std::vector<int>{0, 0, 1, 1}));
    EXPECT_EQ(pp::stages_by_position(names, {2, 4}, 3), (std::vector<int>{0, 0, 1, 1, 2, 2}));
    // 784x512, 512x512, 512x10 weights: the first layer alone outweighs the rest.
    EXPECT_EQ(pp::stages_by_cost(names, {0, 401920, 0, 262656, 0, 5130}, 2),
              (std::vector<int>{0, 0, 1, 1, 1, 1}));
    using xshard::testing::expect_error;
    expect_error(
        [&] {
            pp::stages_by_name(names, {{"layer9", 1}}, 2);
        },
        "stage_config names an unknown module 'layer9' (the chain's modules: flatten, "
        "layer1, relu1, layer2, relu2, layer3)");
    expect_error(
        [&] {
            pp::stages_by_name(names, {{"layer1", 0}}, 2);
        },
        "stage 1 of 2 has no layers");
    expect_error(
        [&] {
            pp::stages_by_name(nested, {{"backbone.layer9", 1}}, 2);
        },
        "stage_config names an unknown module 'backbone.layer9'");
    expect_error(
        [&] {
            pp::stages_by_name(nested, {{"head.dense.weight", 1}, {"head.dense.bias", 0}}, 2);
        },
        "stage_config gives 'head.dense.bias' stage 0 and 'head.dense.weight' stage 1, parts of "
        "module 'head.dense': a pipeline cuts between the chain's modules only");
    expect_error(
        [&] {
            pp::stages_by_name(names, {{"layer1", 1}, {"layer2", 0}}, 2);
        },
        "module 'layer2' (stage 0) follows 'relu1' (stage 1): stages must run along "
        "the chain");
    expect_error([&] { pp::stages_by_position(names, {3}, 3); }, "3 stages need 2 stage starts");
    expect_error([&] { pp::stages_by_cost(names, std::vector<double>(6, 1.0), 7); },
                 "7 stages need at least 7 modules; the chain has 6 (flatten, layer1, relu1, "
                 "layer2, relu2, layer3)");
}

TEST(pipeline, misuse_raises_on_every_rank_before_data_moves) {
    using xshard::testing::expect_error;
    const int world = xshard::testing::world().size();
    const int p = world % 2 == 0 ? 2 : 1;
    const full_mesh_t mesh({p, world / p, 1});
    const auto stage_mesh = pp::stage_mesh_of<stage_mesh_t>(mesh);
    auto model = make_model(stage_mesh);
    using pipe_t = pp::pipeline<decltype(model), X>;
    expect_error(
        [&] {
            pipe_t(mesh, "pp", stage_mesh, model,
                   {.micro_batches = 2, .stage_config = {{"7", 0}, {"linear", 1}}});
        },
        "stage_config names an unknown module 'linear'");
    if (p == 2)
        expect_error(
            [&] {
                pipe_t(mesh, "pp", stage_mesh, model,
                       {.micro_batches = 2, .stage_config = {{"0", 0}}});
            },
            "stage 1 of 2 has no layers");
    if (p == 2)
        expect_error(
            [&] {
                pipe_t(mesh, "pp", stage_mesh, model,
                       {.micro_batches = 3,
                        .scheduler = pp::schedule_kind::interleaved,
                        .virtual_stages = 2});
            },
            "needs the micro-batches (3) to be a multiple of the stages (2)");
    expect_error(
        [&] { pipe_t(mesh, "pp", stage_mesh, model, {.micro_batches = 2, .virtual_stages = 2}); },
        "need the interleaved schedule, not 1f1b");
    expect_error(
        [&] {
            pipe_t(mesh, "pp", stage_mesh, model,
                   {.micro_batches = 2,
                    .scheduler = pp::schedule_kind::interleaved,
                    .virtual_stages = 10});
        },
        "stages need at least");
    pipe_t pipe(mesh, "pp", stage_mesh, model, {.micro_batches = 2});
    nn::parallel_cross_entropy<double, stage_mesh_t> loss;
    const auto b = make_batch(8, 1);
    const auto x =
        xshard::distribute<xshard::dynamic_layout(2)>(stage_mesh, b.x, nn::make_layout({"dp", ""}));
    const auto y = xshard::distribute<xshard::dynamic_layout(1)>(
        stage_mesh, xt::xtensor<std::int64_t, 1>(xt::view(b.y, xt::range(0, 6))),
        nn::make_layout({"dp"}));
    expect_error([&] { pipe.step(x, y, loss); }, "6 labels for a batch of 8 rows");
    const stage_mesh_t other(xshard::communicator::world(), {world / p, p}); // not the stage mesh
    const auto elsewhere =
        xshard::distribute<xshard::dynamic_layout(2)>(other, b.x, nn::make_layout({"dp", ""}));
    const auto labels_elsewhere =
        xshard::distribute<xshard::dynamic_layout(1)>(other, b.y, nn::make_layout({"dp"}));
    expect_error([&] { pipe.step(elsewhere, labels_elsewhere, loss); },
                 "the batch and the labels must live on the pipeline's stage mesh");
}

/// A loss that refuses its second micro-batch (on every rank that computes it).
struct refusing_loss {
    nn::parallel_cross_entropy<double, stage_mesh_t> inner;
    int calls = 0;
    double forward(const X& logits, const labels_t& labels) {
        if (++calls == 2)
            throw xshard::error("xshard: test: the loss refuses micro-batch 1");
        return inner.forward(logits, labels);
    }
    X backward(double scale) { return inner.backward(scale); }
};

/// A layer that passes its input on and throws at its third forward pass (counted over its
/// copies) when armed.
struct faulty_layer {
    std::shared_ptr<int> calls = std::make_shared<int>(0);
    bool armed = false;
    X forward(const X& x) {
        if (armed && ++*calls == 3)
            throw xshard::error("xshard: test: a layer of the first stage fails");
        return x;
    }
    X backward(const X& dy) { return dy; }
    friend void visit_parameters(faulty_layer&, auto&&) {}
};

TEST(pipeline, an_error_during_the_passes_raises_on_every_rank) {
    using xshard::testing::expect_error;
    const int world = xshard::testing::world().size();
    const int p = world % 2 == 0 ? 2 : 1;
    const full_mesh_t mesh({p, world / p, 1});
    const auto stage_mesh = pp::stage_mesh_of<stage_mesh_t>(mesh);
    const auto b = make_batch(std::size_t(8 * (world / p)), 3);
    const auto x =
        xshard::distribute<xshard::dynamic_layout(2)>(stage_mesh, b.x, nn::make_layout({"dp", ""}));
    const auto y =
        xshard::distribute<xshard::dynamic_layout(1)>(stage_mesh, b.y, nn::make_layout({"dp"}));
    const auto [expected_loss, expected] = one_rank(b);
    for (auto kind : {pp::schedule_kind::gpipe, pp::schedule_kind::one_f_one_b,
                      pp::schedule_kind::zero_bubble}) {
        // The last stage's loss fails: every rank raises its error, and the next step is right.
        auto model = make_model(stage_mesh);
        pp::pipeline<decltype(model), X> pipe(mesh, "pp", stage_mesh, model,
                                              {.micro_batches = 4, .scheduler = kind});
        refusing_loss bad;
        expect_error([&] { pipe.step(x, y, bad); }, "the loss refuses micro-batch 1");
        pipe.zero_grad();
        nn::parallel_cross_entropy<double, stage_mesh_t> loss;
        pipe.step(x, y, loss);
        pipe.synchronize_gradients();
        xshard::for_each_weight(pipe.local_parameters(), [&](const std::string& name, auto& w) {
            const xt::xarray<double> g = xshard::gather_all(xshard::ops::resolve(w.grad));
            EXPECT_TRUE(xt::allclose(g, expected.at(name), 1e-12, 1e-12)) << name;
        });
        // A layer of the first stage fails while the others wait for its activations.
        auto chain = nn::sequential(
            nn::column_parallel_linear<double, stage_mesh_t>(stage_mesh, features, 8, 1),
            faulty_layer{},
            nn::row_parallel_linear<double, stage_mesh_t>(stage_mesh, 8, classes, 2));
        chain.get<1>().armed = true;
        pp::pipeline<decltype(chain), X> second(
            mesh, "pp", stage_mesh, chain,
            {.micro_batches = 4,
             .scheduler = kind,
             .stage_starts = p == 2 ? std::vector<std::size_t>{2} : std::vector<std::size_t>{}});
        expect_error([&] { second.step(x, y, loss); }, "a layer of the first stage fails");
    }
}

} // namespace
