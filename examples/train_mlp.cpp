// The flagship: an MLP classifier trained in hybrid data x tensor parallelism. The mesh is
// dp x tp (4 ranks: 2 x 2); the batch is split over dp, the hidden layers over tp
// (column-parallel, GELU, row-parallel, then a column-parallel classifier whose classes stay
// split into the vocabulary-parallel cross-entropy). Each step: forward, backward, the
// data-parallel gradient all-reduce (synchronize_gradients), a Momentum update. The losses
// are the same on 1 rank and on any mesh (ctest compares 1, 2 x 1, 1 x 2 and 2 x 2 to 1e-9).
//
//   mpirun -n 4 build/examples/train_mlp                      # synthetic task, 2 x 2
//   mpirun -n 4 build/examples/train_mlp --tp 4 --epochs 10
//   mpirun -n 4 build/examples/train_mlp --mnist DIR          # DIR/train-images-idx3-ubyte ...
//   mpirun -n 6 build/examples/train_mlp --batch-size 60      # dp = 3: 20 rows per rank
//   mpirun -n 4 build/examples/train_mlp --hsdp 2             # optimizer sharding, level2
//
// --hsdp LEVEL (1, 2 or 3; 0, the default, is off) shards the optimizer's state and master
// weights over dp (MindSpore's hsdp optimizer_level level1; level2 also reduce-scatters the
// gradients; level3 also the weights, gathered layer by layer), with threshold 0 so that
// every weight is sharded: the losses stay the same. The passes then run through
// hsdp::forward / hsdp::backward, which start each layer's gradient reduction as soon as its
// backward is done.
//
// A batch the data-parallel ranks do not divide (64 over dp = 3) is dealt out in blocks of
// 22, 21 and 21 rows (the loader's uneven_batches): the losses stay those of one rank.
#include <xshard/core.hpp>
#include <xshard/data.hpp>
#include <xshard/nn.hpp>
#include <xshard/tensor.hpp>
#include <xshard/train.hpp>

#include <xtensor/xsort.hpp>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

using mesh_2d = xshard::mesh<"dp", "tp">;
namespace nn = xshard::nn;
namespace data = xshard::data;
using T = double;

/// features -> 256 -> 128 -> classes.
auto make_model(const mesh_2d& mesh, std::size_t features, std::size_t classes) {
    return nn::sequential(nn::column_parallel_linear<T, mesh_2d>(mesh, features, 256, 1),
                          nn::gelu_activation<T, mesh_2d>(mesh),
                          nn::row_parallel_linear<T, mesh_2d>(mesh, 256, 128, 2),
                          nn::gelu_activation<T, mesh_2d>(mesh),
                          nn::column_parallel_linear<T, mesh_2d>(mesh, 128, classes, 3));
}

struct options {
    int tp = 0, epochs = 5, hsdp = 0;
    std::size_t batch_size = 64;
    std::string mnist;
};

options parse(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (i + 1 < argc && a == "--tp")
            o.tp = std::atoi(argv[++i]);
        else if (i + 1 < argc && a == "--epochs")
            o.epochs = std::atoi(argv[++i]);
        else if (i + 1 < argc && a == "--batch-size")
            o.batch_size = std::size_t(std::strtoull(argv[++i], nullptr, 10));
        else if (i + 1 < argc && a == "--mnist")
            o.mnist = argv[++i];
        else if (i + 1 < argc && a == "--hsdp")
            o.hsdp = std::atoi(argv[++i]);
        else
            throw xshard::error("usage: train_mlp [--tp N] [--epochs N] [--batch-size N] "
                                "[--mnist DIR] [--hsdp LEVEL]");
    }
    if (o.hsdp < 0 || o.hsdp > 3)
        throw xshard::error("train_mlp: --hsdp takes 0 (off), 1, 2 or 3, not " +
                            std::to_string(o.hsdp));
    return o;
}

/// The example itself; main reports its errors.
int run(int argc, char** argv) {
    const auto o = parse(argc, argv);
    const int world = xshard::communicator::world().size();
    const int tp = o.tp > 0 ? o.tp : world % 2 == 0 ? 2 : 1;
    const mesh_2d mesh({xshard::auto_size, tp});

    // The data: the synthetic task (8192 samples to train on, the next 2048 held out), or MNIST.
    std::vector<data::example<T>> train, test;
    if (o.mnist.empty()) {
        auto all = data::synthetic_classification<T>(
            {.samples = 10240, .features = 32, .classes = 8, .seed = 3});
        test.assign(all.begin() + 8192, all.end());
        all.resize(8192);
        train = std::move(all);
    } else {
        // Each rank reads the files; a rank that cannot raises the error on every rank.
        const auto world_comm = xshard::communicator::world();
        train = data::read_mnist<T>(world_comm, o.mnist + "/train-images-idx3-ubyte",
                                    o.mnist + "/train-labels-idx1-ubyte");
        test = data::read_mnist<T>(world_comm, o.mnist + "/t10k-images-idx3-ubyte",
                                   o.mnist + "/t10k-labels-idx1-ubyte");
    }
    const std::size_t features = train.front().features.size();
    std::int64_t classes = 0;
    for (const auto& e : train)
        classes = std::max(classes, e.label + 1);

    auto model = make_model(mesh, features, std::size_t(classes));
    xshard::parameter_broadcast(
        model); // the same weights everywhere (they are, from the random seeds)
    xshard::optim::momentum optimizer({.lr = 0.05, .momentum = 0.9});
    nn::parallel_cross_entropy<T, mesh_2d> loss_fn;
    std::optional<xshard::hsdp<decltype(model)>> sharding;
    if (o.hsdp > 0)
        sharding.emplace(model,
                         xshard::hsdp_options{.threshold = 0,
                                              .optimizer_level = xshard::optimizer_level(o.hsdp)});
    const data::loader batches(mesh, train,
                               {.batch_size = o.batch_size, .seed = 7, .uneven_batches = true});
    xshard::loss_monitor monitor(mesh, {.steps_per_epoch = batches.steps_per_epoch(),
                                        .epochs = std::size_t(o.epochs),
                                        .print_every = batches.steps_per_epoch() / 4,
                                        .precision = 15});
    if (mesh.rank() == 0)
        std::printf("train_mlp on mesh(%s): %zu features, %lld classes, %zu training samples%s\n",
                    mesh.shape().to_string().c_str(), features, static_cast<long long>(classes),
                    train.size(), o.hsdp ? (", hsdp level" + std::to_string(o.hsdp)).c_str() : "");

    for (int epoch = 0; epoch < o.epochs; ++epoch) {
        for (auto&& [x, y] : batches.epoch(std::uint64_t(epoch))) {
            if (sharding) {
                // Layer by layer: level3 gathers the weights; the reductions start as each
                // layer's backward is done.
                const T loss = loss_fn.forward(sharding->forward(x), y);
                sharding->backward(loss_fn.backward());
                sharding->synchronize_gradients(); // waits for the reductions
                sharding->step(optimizer);         // update the shards, all-gather (level1, 2)
                xshard::for_each_weight(model, [](const std::string&, auto& w) { w.zero_grad(); });
                monitor.step(loss, x.shape()[0]);
                continue;
            }
            const T loss = loss_fn.forward(model.forward(x), y);
            model.backward(loss_fn.backward());
            {
                auto grads = xshard::gradients_of{model};
                xshard::synchronize_gradients(model, grads);
                optimizer.step(model);
            }
            xshard::for_each_weight(model, [](const std::string&, auto& w) { w.zero_grad(); });
            monitor.step(loss, x.shape()[0]);
        }
        monitor.end_epoch();
    }

    if (sharding)
        sharding->gather_weights(); // level3: the weights materialised for evaluation
    // Accuracy on the held-out samples: the logits gathered batch by batch.
    const data::loader held_out(
        mesh, test,
        {.batch_size = 256, .shuffle = false, .drop_remainder = false, .uneven_batches = true});
    std::size_t right = 0, seen = 0;
    for (auto&& [x, y] : held_out.epoch(0)) {
        const auto logits = xshard::gather_all(model.forward(x));
        const auto labels = xshard::gather_all(y);
        for (std::size_t i = 0; i < labels.size(); ++i)
            right += std::size_t(xt::argmax(xt::row(logits, std::ptrdiff_t(i)))()) ==
                     std::size_t(labels(i));
        seen += labels.size();
    }
    const double accuracy = double(right) / double(seen);
    if (mesh.rank() == 0)
        std::printf("held-out accuracy %.2f %% (%zu of %zu)\n", 100 * accuracy, right, seen);
    return 0;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    return xshard::report_errors([&] { return run(argc, argv); });
}
