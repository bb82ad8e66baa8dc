// MindSpore's distributed training tutorial in xshard: ResNet-50 (or --depth 18) on CIFAR-10
// binary files, Momentum (lr 0.01, momentum 0.9), the cross-entropy built from small
// operators (the tutorial's SoftmaxCrossEntropyExpand), a LossMonitor line per step and a
// checkpoint every N steps (ModelCheckpoint).
//
//   mpirun -n 8 build/examples/resnet_cifar10 --cifar DIR/cifar-10-batches-bin
//   mpirun -n 8 build/examples/resnet_cifar10 --mode semi_auto --mp 2
//   mpirun -n 4 build/examples/resnet_cifar10 --mode hybrid --grad-accumulation 2
//   mpirun -n 2 build/examples/resnet_cifar10 --depth 18 --image-size 16 --steps 20 --sync-bn
//   mpirun -n 4 build/examples/resnet_cifar10 --depth 18 --mode spatial --mp 2
//   mpirun -n 8 build/examples/resnet_cifar10 --mode recursive_programming
//
// Modes (mesh dp x mp; the batch is split over dp in every mode, as the tutorial's dataset
// with num_shards = the data-parallel ranks):
//   data_parallel  mp = 1: every weight replicated, gradients all-reduced (gradients_mean);
//                  or, by --gradient-path (xshard/driver/gradient_path.hpp), reduce-scattered,
//                  the update on each rank's slice, the weights all-gathered: sharded_update,
//                  or automatic (the default: where the machine model prices it lower, from
//                  8 ranks).
//   semi_auto      the rules place the collectives: in every residual block the first
//                  convolution splits its output channels over mp, the second its input
//                  channels (a pending sum, all-reduced), the classifier its classes.
//   hybrid         the body data parallel, the classifier written by hand on its slice of
//                  classes (the tutorial's HybridParallelNet): a local product, then the
//                  all-gather of the logits called explicitly.
//   spatial        the images' height split over mp (spatial parallelism, beyond MindSpore):
//                  every convolution and pooling gathers the halo rows its window needs from
//                  the neighbouring bands (the planner's halo step), batch norm and global
//                  pooling all-reduce their sums over mp; the batch over dp as in the other
//                  modes. Bands thinner than a window's halo (too many mp ranks for the image
//                  size: ResNet-18 on 16 x 16 images serves mp 2, not 4) stop with a sentence
//                  on every rank.
//   recursive_programming, sharding_propagation
//                  the tutorial's headline script: ResNet written as a traced function
//                  (models/resnet.hpp) with the loss, no layout written anywhere;
//                  auto_parallel's search on programs chooses every node's layouts
//                  (recursive_programming), or keeps the stem convolution's annotation
//                  (images over dp, output channels over mp) and derives the rest
//                  (sharding_propagation). Batch norm takes the whole batch's statistics,
//                  as --sync-bn does in the other modes; --explain prints why each node runs
//                  as it does.
// Without --cifar, CIFAR-format files are generated (same record format: label byte, 3072
// pixel bytes) so that it runs anywhere. --image-size S (< 32) subsamples the 32 x 32 images
// (nearest pixel) for quick runs; --dtype f32 computes in float (oneDNN kernels).
#include <xshard/auto_parallel.hpp>
#include <xshard/comm/environment.hpp>
#include <xshard/comm/report_errors.hpp>
#include <xshard/data/loader.hpp>
#include <xshard/data/readers.hpp>
#include <xshard/driver/gradient_path.hpp>
#include <xshard/graph.hpp>
#include <xshard/io/checkpoint.hpp>
#include <xshard/models/resnet.hpp>
#include <xshard/nn/resnet.hpp>
#include <xshard/optim/optimizers.hpp>
#include <xshard/train/broadcast.hpp>
#include <xshard/train/gradients.hpp>
#include <xshard/train/hsdp.hpp>

#include <xtensor-blas/xlinalg.hpp>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

using mesh_t = xshard::mesh<"dp", "mp">;
namespace nn = xshard::nn;
namespace data = xshard::data;

struct options {
    int depth = 50;
    std::string cifar, mode = "data_parallel", dtype = "f64", checkpoint_dir = "resnet_ckpt";
    std::string gradient_path = "automatic";
    int mp = 0, grad_accumulation = 1, steps = 20, checkpoint_every = 0;
    std::size_t batch_size = 32, image_size = 32, generated = 640;
    bool sync_bn = false, explain = false;
};

/// CIFAR-10 binary records (label, 1024 red, 1024 green, 1024 blue bytes), from a fixed
/// seed: rank 0 writes them, everyone reads them.
std::vector<std::filesystem::path> generated_cifar(const xshard::communicator& c,
                                                   std::size_t records) {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / "xshard_cifar10";
    const auto file = dir / ("data_batch_generated_" + std::to_string(records) + ".bin");
    xshard::agreed(c, [&] {
        if (c.rank() != 0)
            return 0;
        std::filesystem::create_directories(dir);
        std::mt19937 e(2024);
        std::vector<unsigned char> bytes(records * 3073);
        for (std::size_t r = 0; r < records; ++r) {
            const unsigned label = unsigned(e() % 10);
            bytes[r * 3073] = static_cast<unsigned char>(label);
            // A class-dependent colour gradient plus noise: learnable.
            for (std::size_t p = 0; p < 3072; ++p)
                bytes[r * 3073 + 1 + p] = static_cast<unsigned char>(
                    (label * 25 + (p % 1024) / 32 * (1 + p / 1024) + e() % 64) % 256);
        }
        const auto tmp = file.string() + ".tmp" + std::to_string(::getpid());
        std::ofstream(tmp, std::ios::binary)
            .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
        std::filesystem::rename(tmp, file);
        return 0;
    });
    return {file};
}

/// The tutorial's SoftmaxCrossEntropyExpand on the logits [rows, classes] (classes whole) of
/// this rank's rows, one small operator a line; returns the sum of the rows' losses and sets
/// `dlogits` to d(mean loss)/d logits for a batch of `batch` rows.
template <class T>
T softmax_cross_entropy_expand(const xt::xtensor<T, 2>& logit,
                               const xt::xtensor<std::int64_t, 1>& label, std::size_t batch,
                               xt::xtensor<T, 2>& dlogits) {
    const xt::xtensor<T, 2> logit_max = xt::amax(logit, {1}, xt::keep_dims); // ReduceMax
    const xt::xtensor<T, 2> exp = xt::exp(logit - logit_max);                // Sub, Exp
    const xt::xtensor<T, 2> exp_sum = xt::sum(exp, {1}, xt::keep_dims);      // ReduceSum
    const xt::xtensor<T, 2> softmax_result = exp / exp_sum;                  // Div
    xt::xtensor<T, 2> one_hot = xt::zeros<T>(logit.shape());                 // OneHot
    for (std::size_t i = 0; i < label.size(); ++i)
        one_hot(i, std::size_t(label(i))) = T(1);
    const xt::xtensor<T, 2> softmax_result_log = xt::log(softmax_result); // Log
    const xt::xtensor<T, 1> loss =
        -xt::sum(softmax_result_log * one_hot, {1}); // Mul, ReduceSum, Mul(-1)
    dlogits = (softmax_result - one_hot) / T(batch); // d ReduceMean
    return loss.size() ? T(xt::sum(loss)()) : T(0);
}

/// A loader's batch [rows, 3 S S] as the image batch [rows, 3, S, S]: the same block, seen
/// as images, the rows laid out as the loader dealt them.
template <class T, class X>
nn::tensor<T, mesh_t, 4> image_batch(const mesh_t& mesh, const X& x2, std::size_t S) {
    const auto& xl = x2.local();
    xt::xtensor<T, 4> img = xt::xtensor<T, 4>::from_shape({xl.shape()[0], 3, S, S});
    std::copy_n(xl.data(), xl.size(), img.data());
    auto l4 = nn::make_layout({"", "", "", ""});
    l4.dims[0] = x2.layout().dims[0];
    return nn::tensor<T, mesh_t, 4>(xshard::detail::unchecked, mesh, {x2.shape()[0], 3, S, S},
                                    std::move(img), l4);
}

/// After optimizer step `step`: the LossMonitor line, and the weights and the optimizer's
/// state saved when --checkpoint-every says so.
template <class P, class Optimizer>
void step_done(const options& o, const mesh_t& mesh, std::uint64_t epoch, int step, double loss,
               P& params, Optimizer& optimizer) {
    if (mesh.rank() == 0)
        std::printf("epoch: %llu step: %d, loss %.15g\n",
                    static_cast<unsigned long long>(epoch + 1), step, loss);
    if (o.checkpoint_every <= 0 || step % o.checkpoint_every != 0)
        return;
    const auto path = o.checkpoint_dir + "/resnet" + std::to_string(o.depth) + "-" +
                      std::to_string(step) + ".safetensors";
    if (mesh.rank() == 0)
        std::filesystem::create_directories(o.checkpoint_dir);
    xshard::save_checkpoint(path, params, {.all_parameters = true, .step = step},
                            optimizer.state_of(params));
    if (mesh.rank() == 0)
        std::printf("saved %s\n", path.c_str());
}

/// The run's closing line: steps and seconds since `start`.
inline void training_done(const mesh_t& mesh, int steps,
                          std::chrono::steady_clock::time_point start) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (mesh.rank() == 0)
        std::printf("%d steps in %.2f s\n", steps, seconds);
}

/// The search modes: ResNet and the tutorial's loss as one traced program, laid out by
/// auto_parallel's search in compile(), trained with Momentum (see the file comment).
template <class T, class Samples>
int train_program(const options& o, const mesh_t& mesh, const Samples& samples) {
    namespace ops = xshard::ops;
    namespace models = xshard::models;
    if (o.grad_accumulation != 1)
        throw xshard::error("resnet_cifar10: --grad-accumulation is for the modes of layers, not " +
                            o.mode);
    const std::size_t S = o.image_size, B = o.batch_size;
    auto prog = xshard::trace(
        [&](xshard::traced_tensor x, xshard::traced_tensor y) {
            const auto logits = o.depth == 18
                                    ? models::resnet(x, models::resnet18_depths, 10)
                                    : models::resnet(x, models::resnet50_depths, 10, true);
            return ops::mean<0>(ops::cross_entropy(logits, y)); // SoftmaxCrossEntropyExpand
        },
        xshard::input<T>("x", {B, 3, S, S}), xshard::input<std::int64_t>("y", {B}));
    if (o.mode == "sharding_propagation") // the one annotation: images over dp, filters over mp
        prog.node("conv1.conv2d").annotation.in_layouts = {xshard::layout::parse("[dp, -, -, -]"),
                                                           xshard::layout::parse("[mp, -, -, -]")};
    auto net = xshard::compile<T>(std::move(prog), mesh, {.seed = 1});
    xshard::auto_parallel parallel(net, mesh, o.mode);
    parallel.compile(); // the search, then the program compiled again with its layouts
    const auto& found = *parallel.searched_program();
    if (mesh.rank() == 0) {
        std::printf("resnet%d program on mesh(%s), mode %s, %zu samples of 3x%zux%zu, batch %zu, "
                    "%s; %zu nodes searched: %.3g s per step predicted, %zu bytes of weights "
                    "and %zu of activations per rank\n",
                    o.depth, mesh.shape().to_string().c_str(), o.mode.c_str(), samples.size(), S, S,
                    B, o.dtype.c_str(), found.nodes.size(), found.seconds, found.weight_bytes,
                    found.activation_bytes);
        if (o.explain)
            std::printf("%s", found.explain().c_str());
    }
    xshard::optim::momentum optimizer({.lr = 0.01, .momentum = 0.9});
    const data::loader batches(mesh, samples, {.batch_size = B, .seed = 7, .uneven_batches = true});
    int step = 0;
    const auto start = std::chrono::steady_clock::now();
    for (std::uint64_t epoch = 0; step < o.steps; ++epoch)
        for (auto&& [x2, y] : batches.epoch(epoch)) {
            const double loss = net.train_step(image_batch<T>(mesh, x2, S), y);
            auto grads = xshard::gradients_of(net);
            xshard::synchronize_gradients(net, grads);
            optimizer.step(net);
            xshard::for_each_weight(net, [](const std::string&, auto& w) { w.zero_grad(); });
            step_done(o, mesh, epoch, ++step, loss, net, optimizer);
            if (step >= o.steps)
                break;
        }
    training_done(mesh, step, start);
    return 0;
}

template <class T>
int train(const options& o) {
    const auto world = xshard::communicator::world();
    const bool searched = o.mode == "recursive_programming" || o.mode == "sharding_propagation";
    if (o.mode != "data_parallel" && o.mode != "semi_auto" && o.mode != "hybrid" &&
        o.mode != "spatial" && !searched)
        throw xshard::error("resnet_cifar10: --mode takes data_parallel, semi_auto, hybrid, "
                            "spatial, recursive_programming or sharding_propagation, not " +
                            o.mode);
    if (o.explain && !searched)
        throw xshard::error("resnet_cifar10: --explain is for the search modes "
                            "(recursive_programming, sharding_propagation)");
    if (o.depth != 18 && o.depth != 50)
        throw xshard::error("resnet_cifar10: --depth takes 18 or 50");
    if (o.image_size == 0 || o.image_size > 32 || o.grad_accumulation < 1)
        throw xshard::error("resnet_cifar10: --image-size takes 1..32, --grad-accumulation >= 1");
    const auto path = xshard::parse_gradient_path(o.gradient_path);
    if (path == xshard::gradient_path::sharded_update && o.mode != "data_parallel")
        throw xshard::error("resnet_cifar10: --gradient-path sharded_update is for --mode "
                            "data_parallel");
    const int mp = o.mode == "data_parallel" ? 1 : o.mp > 0 ? o.mp : world.size() % 2 == 0 ? 2 : 1;
    const mesh_t mesh({xshard::auto_size, mp});

    // The data: CIFAR-10's five training batches, or generated records of the same format.
    std::vector<std::filesystem::path> files;
    if (o.cifar.empty())
        files = generated_cifar(world, o.generated);
    else
        for (int i = 1; i <= 5; ++i)
            files.push_back(std::filesystem::path(o.cifar) /
                            ("data_batch_" + std::to_string(i) + ".bin"));
    auto samples = data::read_cifar10<T>(world, files);
    // Subsample to S x S and normalise as the tutorial (Rescale 1/255, Normalize).
    const std::size_t S = o.image_size;
    const T mean[3] = {T(0.4914), T(0.4822), T(0.4465)},
            stdev[3] = {T(0.2023), T(0.1994), T(0.2010)};
    for (auto& s : samples) {
        xt::xtensor<T, 1> f = xt::xtensor<T, 1>::from_shape({3 * S * S});
        for (std::size_t c = 0; c < 3; ++c)
            for (std::size_t i = 0; i < S; ++i)
                for (std::size_t j = 0; j < S; ++j)
                    f((c * S + i) * S + j) =
                        (s.features(c * 1024 + (i * 32 / S) * 32 + j * 32 / S) - mean[c]) /
                        stdev[c];
        s.features = std::move(f);
    }

    if (searched)
        return train_program<T>(o, mesh, samples);
    const bool semi = o.mode == "semi_auto";
    const nn::resnet_options ro{.blocks = {.model_parallel = semi, .sync_bn = o.sync_bn},
                                .classifier_parallel = semi};
    auto run = [&](auto model) {
        constexpr std::size_t classes = 10;
        // hybrid: the classifier by hand, its classes split over mp ([-, mp]), weights from
        // the same seed as the built-in classifier's.
        const std::size_t features = o.depth == 18 ? 512 : 2048;
        auto head =
            nn::make_weight<T>(mesh, std::array{features, classes}, nn::make_layout({"", "mp"}), 99,
                               std::uniform_real_distribution<T>(-T(1) / std::sqrt(T(features)),
                                                                 T(1) / std::sqrt(T(features))));
        const bool hybrid = o.mode == "hybrid", spatial = o.mode == "spatial";
        auto params = std::tie(model, head);
        xshard::parameter_broadcast(params);
        xshard::optim::momentum optimizer({.lr = 0.01, .momentum = 0.9});
        // The gradient path, as the driver chooses it (the sharded update: hsdp level2).
        const xshard::machine_model machine{};
        std::unique_ptr<xshard::hsdp<decltype(params)>> sharding;
        if (o.mode == "data_parallel" && xshard::shards_update(params, path, {}, machine))
            sharding = std::make_unique<xshard::hsdp<decltype(params)>>(
                params, xshard::sharded_update_options(machine));
        const std::size_t micro = o.batch_size / std::size_t(o.grad_accumulation);
        if (micro * std::size_t(o.grad_accumulation) != o.batch_size)
            throw xshard::error("resnet_cifar10: --grad-accumulation must divide --batch-size");
        const data::loader batches(mesh, samples,
                                   {.batch_size = micro, .seed = 7, .uneven_batches = true});
        if (mesh.rank() == 0)
            std::printf("resnet%d on mesh(%s), mode %s, %zu samples of 3x%zux%zu, batch %zu (%d x "
                        "%zu), %s%s, gradients %s\n",
                        o.depth, mesh.shape().to_string().c_str(), o.mode.c_str(), samples.size(),
                        S, S, o.batch_size, o.grad_accumulation, micro, o.dtype.c_str(),
                        o.sync_bn ? ", synchronised batch norm" : "",
                        sharding ? "sharded_update" : "all_reduce");
        int step = 0, k = 0;
        T loss_sum = 0;
        const auto start = std::chrono::steady_clock::now();
        for (std::uint64_t epoch = 0; step < o.steps; ++epoch) {
            for (auto&& [x2, y] : batches.epoch(epoch)) {
                auto x = image_batch<T>(mesh, x2, S);
                const std::size_t rows = x2.shape()[0];
                if (spatial) {
                    // Each mp rank keeps its band of rows: a slice, no message.
                    auto band = x.layout();
                    band.dims[2] = nn::make_layout({"mp"}).dims[0];
                    x = xshard::redistribute<xshard::dynamic_layout(4)>(x, band);
                }
                std::optional<nn::tensor<T, mesh_t>> feats;
                auto logits = [&] {
                    if (hybrid) {
                        feats = model.features(x);
                        // Local product on this rank's classes, then the all-gather called by hand.
                        xt::xtensor<T, 2> part =
                            xt::linalg::dot(feats->local(), head.value.local());
                        auto pl = feats->layout();
                        pl.dims[1] = head.value.layout().dims[1];
                        const nn::tensor<T, mesh_t> partial(xshard::detail::unchecked, mesh,
                                                            {rows, classes}, std::move(part), pl);
                        return xshard::redistribute<xshard::dynamic_layout(2)>(partial,
                                                                               feats->layout());
                    }
                    return model.forward(x);
                }();
                xt::xtensor<T, 2> dl;
                T local =
                    softmax_cross_entropy_expand<T>(logits.local(), y.local(), x2.shape()[0], dl);
                // ReduceMean over the batch: the rows' losses summed over the batch's axes.
                const auto batch_axes = logits.layout().split_axes(0, mesh.shape());
                if (!batch_axes.empty())
                    allreduce(mesh.sub(batch_axes), std::span(&local, 1), xshard::reduction::sum);
                loss_sum += local / T(x2.shape()[0]) / T(o.grad_accumulation);
                auto dlt = nn::as_gradient(nn::tensor<T, mesh_t>(xshard::detail::unchecked, mesh,
                                                                 logits.shape(), std::move(dl),
                                                                 logits.layout()));
                for (auto& v : dlt.local())
                    v /= T(o.grad_accumulation);
                if (hybrid) {
                    // Backward of the hand-written head: this rank's classes' columns, then
                    // dW = feats^T dlogits (each dp rank's term), dfeats = dlogits W^T (each
                    // mp rank's term).
                    auto cols = xshard::redistribute<xshard::dynamic_layout(2)>(
                        dlt, xshard::dual(
                                 nn::make_layout({dlt.layout().dims[0].empty() ? "" : "dp", "mp"}),
                                 mesh.shape()));
                    head.terms().local() +=
                        xt::linalg::dot(xt::transpose(feats->local()), cols.local());
                    xt::xtensor<T, 2> df =
                        xt::linalg::dot(cols.local(), xt::transpose(head.value.local()));
                    model.backward_features(nn::tensor<T, mesh_t>(
                        xshard::detail::unchecked, mesh, feats->shape(), std::move(df),
                        xshard::dual(feats->layout(), mesh.shape())));
                } else {
                    model.backward(dlt);
                }
                if (++k < o.grad_accumulation)
                    continue; // the tutorial's grad_accu: K micro-steps, one reduction
                k = 0;
                if (sharding) {
                    sharding->synchronize_gradients();
                    sharding->step(optimizer);
                } else {
                    auto grads = xshard::gradients_of{params};
                    xshard::synchronize_gradients(params, grads);
                    optimizer.step(params);
                }
                xshard::for_each_weight(params, [](const std::string&, auto& w) { w.zero_grad(); });
                step_done(o, mesh, epoch, ++step, double(loss_sum), params, optimizer);
                loss_sum = 0;
                if (step >= o.steps)
                    break;
            }
        }
        training_done(mesh, step, start);
        return 0;
    };
    return o.depth == 18 ? run(nn::resnet18<T>(mesh, 10, ro)) : run(nn::resnet50<T>(mesh, 10, ro));
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    return xshard::report_errors([&] {
        options o;
        CLI::App app("ResNet on CIFAR-10, MindSpore's distributed training tutorial");
        app.add_option("--depth", o.depth, "18 or 50");
        app.add_option("--cifar", o.cifar, "cifar-10-batches-bin directory (else generated files)");
        app.add_option("--mode", o.mode,
                       "data_parallel, semi_auto, hybrid, spatial, recursive_programming or "
                       "sharding_propagation");
        app.add_option(
            "--mp", o.mp,
            "model-parallel ranks (semi_auto, hybrid), or the bands of each image (spatial); "
            "default 2 when even");
        app.add_option("--grad-accumulation", o.grad_accumulation, "micro-steps per update");
        app.add_option("--steps", o.steps, "optimizer steps");
        app.add_option("--batch-size", o.batch_size, "global batch (the tutorial's 32)");
        app.add_option("--image-size", o.image_size, "subsample the images to S x S");
        app.add_option("--generated", o.generated, "records of the generated files");
        app.add_option("--checkpoint-every", o.checkpoint_every, "save every N steps (0: never)");
        app.add_option("--checkpoint-dir", o.checkpoint_dir, "where checkpoints go");
        app.add_option("--dtype", o.dtype, "f64 or f32");
        app.add_option("--gradient-path", o.gradient_path,
                       "automatic, all_reduce or sharded_update (data_parallel)");
        app.add_flag("--sync-bn", o.sync_bn, "synchronised batch norm over the batch's ranks");
        app.add_flag("--explain", o.explain,
                     "the search modes: print every node's layouts and why (rank 0)");
        try {
            app.parse(argc, argv);
        } catch (const CLI::ParseError& e) {
            if (xshard::communicator::world().rank() == 0)
                app.exit(e);
            return e.get_exit_code();
        }
        if (o.dtype == "f32")
            return train<float>(o);
        if (o.dtype != "f64")
            throw xshard::error("resnet_cifar10: --dtype takes f64 or f32");
        return train<double>(o);
    });
}
