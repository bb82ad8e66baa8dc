// Pipeline parallelism on the example of MindSpore's AutoParallel document: the network
// flatten -> 784x512 matmul -> relu -> dense 512x512 -> relu -> dense 512x10 cut into 2
// stages by its stage_config, 4 micro-batches per step of 32 samples, a data-parallel
// dataset, SGD, the loss printed as LossMonitor does. The mesh is pp x dp x tp: 1 rank runs the whole chain
// (pp 1), 4 ranks pp 2 x dp 2, 8 ranks pp 2 x dp 2 x tp 2 (layer1 and layer3 split their
// outputs over tp, layer2 its inputs); the losses are the same on each (ctest checks 1e-9).
//
//   mpirun -n 4 build/examples/pipeline_mnist                 # MNIST-format files it writes
//   mpirun -n 4 build/examples/pipeline_mnist --mnist DIR     # DIR/train-images-idx3-ubyte ...
//   mpirun -n 8 build/examples/pipeline_mnist --schedule zero_bubble
//
// The MindSpore original, for comparison:
//   net_with_loss = Pipeline(nn.WithLossCell(net, loss_fn), 4, stage_config={"_backbone.flatten":
//   0,
//       "_backbone.layer1": 0, "_backbone.relu1": 0, "_backbone.layer2": 1, "_backbone.relu2": 1,
//       "_backbone.layer3": 1})
//   parallel_net.pipeline(stages=2); pp_grad_reducer = PipelineGradReducer(...)
#include <xshard/core.hpp>
#include <xshard/data.hpp>
#include <xshard/nn.hpp>
#include <xshard/pipeline.hpp>
#include <xshard/train.hpp>

#include "mnist_like.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

using stage_mesh_t = xshard::mesh<"dp", "tp">;
using full_mesh_t = xshard::mesh<"pp", "dp", "tp">;
namespace nn = xshard::nn;
namespace data = xshard::data;
namespace pp = xshard::pipeline;
using T = double;
using X = nn::tensor<T, stage_mesh_t>;

/// MindSpore's nn.Flatten: images arrive as rows of 28 x 28 = 784 pixels already, so it
/// passes them on (a layer of its own so that the stage_config names it).
class flatten {
public:
    explicit flatten(const stage_mesh_t&) {}
    X forward(const X& x) { return x; }
    X backward(const X& dy) { return dy; }
    friend void visit_parameters(flatten&, auto&&) {}
};

/// The AutoParallel document's Network: its modules, named as there, in the order its
/// construct runs them.
struct network {
    flatten flat;
    nn::column_parallel_linear<T, stage_mesh_t> layer1; // MatMulCell: no bias
    nn::relu_activation<T, stage_mesh_t> relu1;
    nn::row_parallel_linear<T, stage_mesh_t> layer2;
    nn::relu_activation<T, stage_mesh_t> relu2;
    nn::column_parallel_linear<T, stage_mesh_t> layer3;

    explicit network(const stage_mesh_t& m)
        : flat(m)
        , layer1(m, 28 * 28, 512, 1, {.bias = false})
        , relu1(m)
        , layer2(m, 512, 512, 2)
        , relu2(m)
        , layer3(m, 512, 10, 3) {}

    friend void visit_parameters(network& n, auto&& visit) {
        visit("flatten", n.flat);
        visit("layer1", n.layer1);
        visit("relu1", n.relu1);
        visit("layer2", n.layer2);
        visit("relu2", n.relu2);
        visit("layer3", n.layer3);
    }
};

struct options {
    int tp = 0, epochs = 2;
    std::string mnist, data_dir = "pipeline_mnist_data", schedule = "1f1b";
};

options parse(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (i + 1 < argc && a == "--tp")
            o.tp = std::atoi(argv[++i]);
        else if (i + 1 < argc && a == "--epochs")
            o.epochs = std::atoi(argv[++i]);
        else if (i + 1 < argc && a == "--mnist")
            o.mnist = argv[++i];
        else if (i + 1 < argc && a == "--data")
            o.data_dir = argv[++i];
        else if (i + 1 < argc && a == "--schedule")
            o.schedule = argv[++i];
        else
            throw xshard::error("usage: pipeline_mnist [--tp N] [--epochs N] [--mnist DIR] "
                                "[--data DIR] [--schedule gpipe|1f1b|zero_bubble]");
    }
    return o;
}

int run(int argc, char** argv) {
    const auto o = parse(argc, argv);
    const auto world = xshard::communicator::world();
    const int pp_size = world.size() > 1 ? 2 : 1;
    const int tp = o.tp > 0 ? o.tp : world.size() >= 8 ? 2 : 1;
    const full_mesh_t mesh({pp_size, xshard::auto_size, tp});
    const auto stage_mesh = pp::stage_mesh_of<stage_mesh_t>(mesh);

    // The data: MNIST-format files, written here unless --mnist names real ones.
    std::string dir = o.mnist;
    if (dir.empty()) {
        dir = o.data_dir;
        xshard::agreed(world, [&] { // a failed write raises on every rank
            if (world.rank() == 0)
                write_mnist_like(dir);
        });
    }
    // Every rank builds the network on its stage mesh (from the same seeds); the pipeline
    // runs on each rank only its stage's modules. On one rank (pp 1) every module is on
    // stage 0.
    network net(stage_mesh);
    std::map<std::string, int> stage_config;
    if (pp_size == 2)
        stage_config = {{"flatten", 0}, {"layer1", 0}, {"relu1", 0},
                        {"layer2", 1},  {"relu2", 1},  {"layer3", 1}};
    pp::pipeline<network, X> pipe(mesh, "pp", stage_mesh, net,
                                  {.micro_batches = 4,
                                   .scheduler = pp::parse_schedule(o.schedule),
                                   .stage_config = stage_config,
                                   .output_broadcast = true});
    // parameter_broadcast per stage: each stage's parameters from one owner among their
    // data-parallel copies (the stage mesh's; they are equal already, from the seeds).
    xshard::parameter_broadcast(pipe.local_parameters());
    // The first stage reads the images, the last the labels, no other rank touches the
    // dataset (the sample count is agreed over the mesh, so every loader counts the same
    // steps).
    const auto train = data::read_mnist<T>(world, dir + "/train-images-idx3-ubyte",
                                           dir + "/train-labels-idx1-ubyte",
                                           {.images = pipe.reads_inputs(),
                                            .labels = pipe.reads_labels()});
    xshard::optim::sgd optimizer({.lr = 0.1});
    nn::parallel_cross_entropy<T, stage_mesh_t> loss_fn;
    const data::loader batches(stage_mesh, train, {.batch_size = 32, .seed = 1});
    xshard::loss_monitor monitor(mesh, {.steps_per_epoch = batches.steps_per_epoch(),
                                        .epochs = std::size_t(o.epochs),
                                        .print_every = batches.steps_per_epoch() / 4,
                                        .precision = 15});
    if (mesh.rank() == 0) {
        std::printf("pipeline_mnist on mesh(%s), schedule %s, 4 micro-batches, %zu samples\n",
                    mesh.shape().to_string().c_str(), o.schedule.c_str(), train.size());
        for (const auto& [name, stage] : pipe.stages())
            std::printf("  %-8s stage %d\n", name.c_str(), stage);
        std::printf("bubble predicted by the schedule table: %.4f, peak in-flight micro-batches "
                    "%d\n",
                    pipe.predicted().bubble(), pipe.predicted().peak());
    }
    for (int epoch = 0; epoch < o.epochs; ++epoch) {
        for (auto&& [x, y] : batches.epoch(std::uint64_t(epoch))) {
            // Only the first stage hands the images in, only the last the labels.
            const T loss = pipe.step(pipe.reads_inputs() ? &x : nullptr,
                                     pipe.reads_labels() ? &y : nullptr, loss_fn);
            pipe.synchronize_gradients(); // PipelineGradReducer: over dp, once per step
            optimizer.step(pipe.local_parameters());
            pipe.zero_grad();
            monitor.step(loss, x.shape()[0]);
        }
        monitor.end_epoch();
    }
    return 0;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    return xshard::report_errors([&] { return run(argc, argv); });
}
