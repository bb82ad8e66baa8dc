// MindSpore's AutoParallel example in C++: the network flatten -> MatMulCell
// 784x512 -> relu -> dense 512 -> relu -> dense 10, configured by `xshard::auto_parallel` in
// semi_auto mode with optimizer sharding (hsdp), two pipeline stages cut by the original's
// stage_config (4 micro-batches), a data-parallel dataset, the parameter strategy and
// communication group files saved, local norms dumped, fp32 communication, and trained by
// the driver (`xshard::trainer`, MindSpore's Model) for 2 epochs with loss_monitor(1); then
// evaluated on the held-out samples (Model.eval, accuracy).
//
// The mesh is pp x dp x tp: pipeline(stages=2) on an even number of ranks (1 stage on one
// rank or an odd number), tp 2 at 8 ranks (MatMulCell and layer3 split their outputs over
// tp, layer2 its inputs). Every mesh prints the same losses (ctest checks 1, 2, 4 and 8 ranks
// against one to 1e-9).
//
//   mpirun -n 4 build/examples/auto_parallel                    # MNIST-format files it writes
//   mpirun -n 4 build/examples/auto_parallel --mnist DIR        # DIR/train-images-idx3-ubyte ...
//   mpirun -n 4 build/examples/auto_parallel --mode recursive_programming [--measure-machine]
//
// The search modes (recursive_programming, sharding_propagation) search the network as the
// user writes it: a traced function (`traced_network`, no hand-written backward), cut at its
// scopes into the same modules (an xshard::program_chain, which the pipeline cuts by the same
// stage_config). compile() searches its whole program on the stage mesh for one micro-batch
// and compiles each module with the layouts found (printed). Its weights start as the layer
// network's (copied by name), so its losses equal the semi_auto network's.
//
// The MindSpore original, for comparison:
//   net_with_loss = Pipeline(nn.WithLossCell(net, loss_fn), 4, stage_config={...})
//   parallel_net = AutoParallel(net_with_loss, parallel_mode="semi_auto")
//   parallel_net.hsdp(); parallel_net.pipeline(stages=2)
//   parallel_net.dataset_strategy("data_parallel")
//   parallel_net.save_param_strategy_file(f"/tmp/param_{get_rank()}.ckpt") ...
//   model = Model(network=parallel_net, optimizer=optimizer)
//   model.train(epoch=2, train_dataset=dataset, callbacks=[LossMonitor(per_print_times=1)])
#include <xshard/auto_parallel.hpp>
#include <xshard/core.hpp>
#include <xshard/data.hpp>
#include <xshard/graph.hpp>
#include <xshard/nn.hpp>
#include <xshard/pipeline.hpp>
#include <xshard/search.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/gather.hpp>
#include <xshard/train.hpp>

#include "mnist_like.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <type_traits>
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
/// MatMulCell is a linear layer without bias; nn.Dense has one.
struct network {
    flatten flat;
    nn::column_parallel_linear<T, stage_mesh_t> layer1;
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

    X forward(const X& x) {
        return layer3.forward(
            relu2.forward(layer2.forward(relu1.forward(layer1.forward(flat.forward(x))))));
    }
    X backward(const X& dy) {
        return flat.backward(
            layer1.backward(relu1.backward(layer2.backward(relu2.backward(layer3.backward(dy))))));
    }

    friend void visit_parameters(network& n, auto&& visit) {
        visit("flatten", n.flat);
        visit("layer1", n.layer1);
        visit("relu1", n.relu1);
        visit("layer2", n.layer2);
        visit("relu2", n.relu2);
        visit("layer3", n.layer3);
    }
};

/// The same network as a traced function: each scope a module of the chain, named as the
/// layers are (MatMulCell has no bias; flatten is the identity, and no node).
auto traced_network(xshard::traced_tensor x) {
    namespace ops = xshard::ops;
    const auto dense = [&](const char* name, std::size_t in, std::size_t out, bool bias) {
        xshard::name_scope s(name);
        auto y = ops::matmul(x, xshard::param("weight", {in, out}));
        return bias ? y + xshard::param("bias", {out}) : y;
    };
    const auto relu = [&](const char* name) {
        xshard::name_scope s(name);
        return ops::relu(x);
    };
    x = dense("layer1", 28 * 28, 512, false);
    x = relu("relu1");
    x = dense("layer2", 512, 512, true);
    x = relu("relu2");
    return dense("layer3", 512, 10, true);
}

/// Gives every weight of `to` the value of the weight of `from` with its name (collective).
template <class From, class To>
void copy_weights(From& from, To& to) {
    std::map<std::string, xt::xarray<T>> values;
    xshard::for_each_weight(from, [&](const std::string& name, auto& w) {
        values[name] = xshard::gather_all(w.value);
    });
    xshard::for_each_weight(to, [&](const std::string& name, auto& w) {
        using D = std::remove_cvref_t<decltype(w.value)>;
        w.value = xshard::distribute<D::static_layout>(w.value.mesh(), values.at(name),
                                                       w.value.layout());
    });
}

int run(int argc, char** argv) {
    CLI::App app("MindSpore's AutoParallel example with xshard::auto_parallel");
    std::string mode = "semi_auto", mnist, data_dir = "auto_parallel_data",
                out = "auto_parallel_out", level = "level1";
    int epochs = 2, tp = 0, stages = 0;
    double lr = 0.01;
    bool print_norms = false, gradients_mean = false, measure = false;
    app.add_option("--mode", mode, "parallel_mode")
        ->check(CLI::IsMember({"semi_auto", "sharding_propagation", "recursive_programming"}));
    app.add_option("--epochs", epochs, "epochs")->check(CLI::PositiveNumber);
    app.add_option("--mnist", mnist, "directory of MNIST IDX files (default: generated)");
    app.add_option("--data", data_dir, "where to write the generated MNIST-format files");
    app.add_option("--out", out, "directory of the strategy, group and local norm files");
    app.add_option("--tp", tp, "tensor-parallel ranks (default: 2 at 8 ranks, else 1)");
    app.add_option("--stages", stages, "pipeline stages (default: 2 on an even world)");
    app.add_option("--hsdp-level", level, "hsdp optimizer_level");
    app.add_option("--lr", lr, "SGD learning rate (the seed's 1e-2)");
    app.add_flag("--measure-machine", measure,
                 "the search modes price with the ranks' measured GEMM speed and memory "
                 "bandwidth (xshard::measure_machine) instead of the cost model's defaults");
    app.add_flag("--print-norms", print_norms, "enable_device_local_norm (prints every rank's)");
    app.add_flag("--gradients-mean", gradients_mean,
                 "enable_gradients_mean (divides by the data-parallel copies: see below)");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e); // the same arguments on every rank: every rank exits alike
    }

    const auto world = xshard::communicator::world();
    const bool searched = mode != "semi_auto";
    const int pp_size = stages > 0 ? stages : world.size() % 2 == 0 ? 2 : 1;
    const int tp_size = tp > 0 ? tp : world.size() >= 8 ? 2 : 1;
    const full_mesh_t mesh({pp_size, xshard::auto_size, tp_size});
    const auto stage_mesh = pp::stage_mesh_of<stage_mesh_t>(mesh);

    // The data: MNIST-format files, written here unless --mnist names real ones.
    std::string dir = mnist;
    if (dir.empty()) {
        dir = data_dir;
        xshard::agreed(world, [&] { // a failed write raises on every rank
            if (world.rank() == 0)
                write_mnist_like(dir);
        });
    }
    // The training set: the first stage reads the images, the last the labels, no other rank
    // touches them (the sample count is agreed over the mesh). The held-out set is read
    // whole: Model.eval runs the whole chain on every stage.
    const int stage = mesh.coords()[0];
    const auto train = data::read_mnist<T>(
        world, dir + "/train-images-idx3-ubyte", dir + "/train-labels-idx1-ubyte",
        {.images = stage == 0, .labels = stage == pp_size - 1});
    const auto test = data::read_mnist<T>(world, dir + "/t10k-images-idx3-ubyte",
                                          dir + "/t10k-labels-idx1-ubyte");

    // ms.set_seed(1); net = Network(): every rank builds the whole network on its stage mesh
    // from the same seeds; the pipeline runs on each rank only its stage's modules.
    const auto train_with = [&](auto& net) {
        xshard::auto_parallel parallel_net(net, mesh, mode);
        parallel_net.hsdp(-1, 64, level);
        parallel_net.pipeline(pp_size);
        parallel_net.dataset_strategy("data_parallel");
        const std::string rank = std::to_string(world.rank());
        parallel_net.save_param_strategy_file(out + "/param_" + rank + ".json");
        parallel_net.set_group_ckpt_save_file(out + "/comm_group_" + rank + ".json");
        parallel_net.dump_local_norm(out + "/local_norm");
        parallel_net.disable_strategy_file_only_for_trainable_params();
        parallel_net.enable_fp32_communication();
        if (print_norms)
            parallel_net.enable_device_local_norm();
        // xshard's loss is the mean over the whole global batch already, so the sum of the
        // gradient's terms over the data-parallel copies is the gradient (MindSpore's mean of
        // per-device means): enable_gradients_mean would divide it again by the copies, and the
        // losses would then depend on the mesh. Off unless asked for.
        if (gradients_mean)
            parallel_net.enable_gradients_mean();
        parallel_net.disable_gradient_fp32_sync();
        // disable_loss_repeated_mean (the seed calls it) scales the loss gradient by the ranks
        // that compute the loss of the same rows, loss_repetitions(): a stage's ranks over the
        // data-parallel ones, i.e. tp here. The seed's mesh has no tensor parallelism (r = 1: no
        // effect), so it is called where that holds; with tp > 1 (8 ranks) it would make every
        // gradient tp times one rank's and the losses would depend on the mesh.
        if (parallel_net.loss_repetitions() == 1)
            parallel_net.disable_loss_repeated_mean();
        if (measure) {
            parallel_net.set_machine_model(xshard::measure_machine<T>(mesh.comm()));
            if (mesh.rank() == 0)
                std::printf("measured machine: GEMM %.2f GFLOP/s (half speed at %.0f), memory "
                            "%.2f GB/s per rank\n",
                            parallel_net.machine().gemm_flops / 1e9,
                            parallel_net.machine().gemm_half_dimension,
                            parallel_net.machine().memory_bandwidth / 1e9);
        }

        // Pipeline(WithLossCell(net, loss_fn), 4, stage_config) and Model(parallel_net, ...).
        xshard::optim::sgd optimizer({.lr = lr});
        nn::parallel_cross_entropy<T, stage_mesh_t> loss_fn;
        xshard::trainer_options cell{.micro_batches = 4};
        if (pp_size == 2) {
            cell.stage_config = {{"layer1", 0}, {"relu1", 0}, {"layer2", 1}, {"relu2", 1},
                                 {"layer3", 1}};
            if (!searched)
                cell.stage_config["flatten"] = 0;
        }
        xshard::trainer model(parallel_net, loss_fn, optimizer, cell); // compile(): the files
        if (const auto& found = parallel_net.searched_program(); found && mesh.rank() == 0)
            std::printf("%s", found->explain().c_str());
        const auto data_mesh = stage_mesh.with_dataset_strategy(parallel_net.dataset_mode());
        const data::loader dataset(data_mesh, train,
                                   {.batch_size = 32,
                                    .seed = 1,
                                    .uneven_batches = true,
                                    .layouts = parallel_net.input_layouts()});
        if (mesh.rank() == 0)
            std::printf("auto_parallel %s on mesh(%s): hsdp %s, pipeline(stages=%d), "
                        "dataset_strategy data_parallel, %zu samples, batch 32\n",
                        mode.c_str(), mesh.shape().to_string().c_str(), level.c_str(), pp_size,
                        train.size());

        model.train(std::size_t(epochs), dataset,
                    {xshard::callbacks::loss_monitor(1, stdout, /*precision=*/15)});

        const data::loader held_out(data_mesh, test,
                                    {.batch_size = 256,
                                     .shuffle = false,
                                     .drop_remainder = false,
                                     .uneven_batches = true,
                                     .layouts = parallel_net.input_layouts()});
        const auto metrics = model.eval(held_out);
        if (mesh.rank() == 0)
            std::printf("eval on %zu held-out samples: loss %.15g accuracy %.2f %%\n",
                        metrics.samples, metrics.loss, 100 * metrics.accuracy);
    };
    if (searched) {
        // Traced for one micro-batch of the batch of 32 (any other row count is traced when
        // met: a last batch, the held-out batches).
        const std::size_t rows = pp_size > 1 ? 32 / 4 : 32;
        xshard::program_chain<T, stage_mesh_t> net(traced_network, stage_mesh, {.seed = 1},
                                                   xshard::input<T>("x", {rows, 28 * 28}));
        network layers(stage_mesh);
        copy_weights(layers, net);
        train_with(net);
    } else {
        network net(stage_mesh);
        train_with(net);
    }
    return 0;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    return xshard::report_errors([&] { return run(argc, argv); });
}
