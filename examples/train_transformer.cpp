// A small GPT-style character model trained with tensor parallelism over heads and MLP: a
// vocabulary-parallel embedding, learned positions, transformer blocks (head-parallel
// attention, Megatron MLP), a vocabulary-parallel output layer and cross-entropy, AdamW
// with warm-up and cosine decay. Text: any file (default: the README). The loss falls from
// log 256 = 5.5; on any mesh it equals the one-rank run (ctest compares the first 20 steps).
//
//   mpirun -n 4 build/examples/train_transformer --text README.md            # dp 2 x tp 2
//   mpirun -n 2 build/examples/train_transformer --text README.md --tp 2 --steps 300
//   mpirun -n 4 build/examples/train_transformer --mode recursive_programming
//
// --mode recursive_programming or sharding_propagation (MindSpore's parallel modes): the same
// decoder without learned positions, written as a traced function (xshard::models::
// transformer_block, no hand-written backward) and compiled onto the mesh; compile() searches
// every node's strategy (xshard::auto_parallel; the choices printed, with why), keeping the
// blocks' Megatron annotations under sharding_propagation, and the driver (xshard::trainer)
// trains it with AdamW at a constant rate. Its losses too are the same on every mesh (ctest
// compares them). There the driver also saves a checkpoint every N steps (--checkpoint-every N,
// into --checkpoint-dir, one file replaced each time: a save that fails or is cut short leaves
// the previous one) and resumes from one (--resume FILE) on any mesh and world size: the
// batches of the steps it holds are skipped and the losses continue those of the run that saved
// it.
//
//   mpirun -n 4 build/examples/train_transformer --mode recursive_programming --steps 40
//       --checkpoint-every 5 --checkpoint-dir ckpt
//   mpirun -n 2 build/examples/train_transformer --mode recursive_programming --steps 40
//       --tp 1 --resume ckpt/train_transformer.safetensors
//
// --crossovers fit (any mode): before training, the crossovers between the pairwise reductions
// and MPI's collectives are fitted on the ranks and their network (xshard::
// calibrate_reduce_tuning) and installed for every plan and gradient synchronizer made
// afterwards (xshard::use_reduce_crossovers); the defaults were fitted on one node.
#include <xshard/auto_parallel.hpp>
#include <xshard/core.hpp>
#include <xshard/data.hpp>
#include <xshard/graph.hpp>
#include <xshard/models/transformer.hpp>
#include <xshard/nn.hpp>
#include <xshard/search/calibrate.hpp>
#include <xshard/tensor.hpp>
#include <xshard/train.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

using mesh_2d = xshard::mesh<"dp", "tp">;
namespace nn = xshard::nn;
namespace data = xshard::data;
using T = double;

constexpr std::size_t sequence = 32, features = 64, heads = 4, layers = 2, vocabulary = 256;

/// Learned positions added to every sequence's tokens (a replicated [sequence, features]
/// weight); the rows are whole sequences.
class positions {
public:
    explicit positions(const mesh_2d& mesh)
        : table_(nn::make_weight<T>(mesh, std::array{sequence, features}, nn::make_layout({"", ""}),
                                    99, std::normal_distribution<T>(0, 0.02))) {}

    nn::tensor<T, mesh_2d> forward(nn::tensor<T, mesh_2d> x) {
        for (std::size_t r = 0; r < x.local().shape()[0]; ++r)
            xt::row(x.local(), std::ptrdiff_t(r)) +=
                xt::row(table_.value.local(), std::ptrdiff_t(r % sequence));
        return x;
    }
    /// Each rank adds its rows' terms (the gradient convention of xshard/nn/module.hpp).
    nn::tensor<T, mesh_2d> backward(const nn::tensor<T, mesh_2d>& dy) {
        auto& grad = table_.terms().local();
        for (std::size_t r = 0; r < dy.local().shape()[0]; ++r)
            xt::row(grad, std::ptrdiff_t(r % sequence)) += xt::row(dy.local(), std::ptrdiff_t(r));
        return dy;
    }
    friend void visit_parameters(positions& p, auto&& visit) { visit("table", p.table_); }

private:
    xshard::weight<nn::tensor<T, mesh_2d>> table_;
};

using windows_t = xshard::dtensor<std::int64_t, mesh_2d, xshard::dynamic_layout(2)>;

/// The input tokens and the next ones (the targets) of windows [B, sequence + 1]: [B x sequence]
/// each, rows split as the windows'.
auto tokens_of(const windows_t& windows) {
    const auto& w = windows.local();
    xt::xtensor<std::int64_t, 1> in = xt::flatten(xt::view(w, xt::all(), xt::range(0, sequence)));
    xt::xtensor<std::int64_t, 1> next =
        xt::flatten(xt::view(w, xt::all(), xt::range(1, sequence + 1)));
    const std::array<std::size_t, 1> shape{windows.shape()[0] * sequence};
    const auto rows_layout = nn::make_layout({windows.layout().axes(0).empty() ? "" : "dp"});
    return std::pair(xshard::from_local(windows.mesh(), shape, std::move(in), rows_layout),
                     xshard::from_local(windows.mesh(), shape, std::move(next), rows_layout));
}

class gpt {
public:
    explicit gpt(const mesh_2d& mesh)
        : tokens_(mesh, vocabulary, features, 1)
        , positions_(mesh)
        , norm_(mesh, features)
        , head_(mesh, features, vocabulary, 2, {.bias = false}) {
        for (std::size_t l = 0; l < layers; ++l)
            blocks_.emplace_back(
                mesh, features, unsigned(10 + 10 * l),
                nn::transformer_block<T, mesh_2d>::options{.heads = heads, .sequence = sequence});
    }

    /// The mean next-character loss of a batch of windows [B, sequence + 1].
    T forward(const windows_t& windows) {
        const auto [ids, targets] = tokens_of(windows);
        auto h = positions_.forward(tokens_.forward(ids));
        for (auto& b : blocks_)
            h = b.forward(h);
        return loss_.forward(head_.forward(norm_.forward(h)), targets);
    }

    void backward() {
        auto g = norm_.backward(head_.backward(loss_.backward()));
        for (auto b = blocks_.rbegin(); b != blocks_.rend(); ++b)
            g = b->backward(g);
        tokens_.backward(positions_.backward(g));
    }

    friend void visit_parameters(gpt& m, auto&& visit) {
        visit("tokens", m.tokens_);
        visit("positions", m.positions_);
        visit("blocks", m.blocks_);
        visit("norm", m.norm_);
        visit("head", m.head_);
    }

private:
    nn::vocab_parallel_embedding<T, mesh_2d> tokens_;
    positions positions_;
    std::vector<nn::transformer_block<T, mesh_2d>> blocks_;
    nn::layer_normalization<T, mesh_2d> norm_;
    nn::column_parallel_linear<T, mesh_2d> head_;
    nn::parallel_cross_entropy<T, mesh_2d> loss_;
};

/// Runs steps `first` + 1 .. `steps` (the batches of the first `first` are skipped: a resumed
/// run), `one_step(windows, step)` giving each one's loss, over the batches' epochs; prints
/// every loss, then (the loss of one batch is noisy) the means of the first and the last ten
/// steps.
template <class Loader, class Step>
void train_steps(const mesh_2d& mesh, const Loader& batches, std::int64_t first,
                 std::int64_t steps, Step one_step) {
    xshard::loss_monitor monitor(mesh, {.steps_per_epoch = std::size_t(std::max<std::int64_t>(
                                            steps - first, 1)),
                                        .epochs = 1,
                                        .print_every = 1,
                                        .precision = 15});
    std::int64_t step = 0;
    std::vector<double> losses;
    for (std::uint64_t epoch = 0; step < steps; ++epoch)
        for (auto&& windows : batches.epoch(epoch)) {
            if (step == steps)
                break;
            if (++step <= first)
                continue;
            const double loss = one_step(windows, step);
            monitor.step(loss, windows.shape()[0] * sequence);
            losses.push_back(loss);
        }
    monitor.end_epoch();
    const std::size_t n = std::min<std::size_t>(10, losses.size());
    auto mean = [&](auto first) {
        return std::accumulate(first, first + long(n), 0.0) / double(n);
    };
    if (mesh.rank() == 0 && n > 0)
        std::printf("mean loss of the first %zu steps %.3f, of the last %zu steps %.3f\n", n,
                    mean(losses.begin()), n, mean(losses.end() - long(n)));
}

/// The decoder of the searched modes as a traced function of the token ids (no learned
/// positions): the embedding, the blocks (models::transformer_block, the same computation as
/// nn::transformer_block), a final norm and the head. With `annotate`, the blocks carry
/// Megatron's strategies over "tp" (what MindSpore users write before sharding propagation);
/// without, the search decides every node.
auto decoder(bool annotate) {
    return [annotate](xshard::traced_tensor ids) {
        namespace ops = xshard::ops;
        const auto normal = xshard::initializer::normal(0, 0.02);
        xshard::traced_tensor h = ids;
        {
            xshard::name_scope s("tokens");
            h = ops::embedding(ids, xshard::param("table", {vocabulary, features}, normal));
        }
        for (std::size_t l = 0; l < layers; ++l) {
            xshard::name_scope s("blocks." + std::to_string(l));
            h = xshard::models::transformer_block(h, {.features = features,
                                                      .heads = heads,
                                                      .sequence = sequence,
                                                      .tensor_axis = annotate ? "tp" : ""});
        }
        {
            xshard::name_scope s("norm");
            h = ops::layer_norm(
                h, xshard::param("gamma", {features}, xshard::initializer::constant(1)),
                xshard::param("beta", {features}, xshard::initializer::zeros()));
        }
        xshard::name_scope s("head");
        return ops::matmul(h, xshard::param("weight", {features, vocabulary}, normal));
    };
}

/// Where the searched modes save and resume (see the file comment).
struct checkpointing {
    std::int64_t every = 0; // 0: never saves
    std::string directory = "train_transformer.ckpt";
    std::string resume; // a checkpoint to start from, or empty
};

/// --mode recursive_programming or sharding_propagation (see the file comment).
template <class Loader>
int run_searched(const mesh_2d& mesh, const Loader& batches, std::int64_t steps,
                 const std::string& mode, const checkpointing& ckpt) {
    // Traced for a batch of 8 windows; a smaller last batch is traced again for its rows.
    auto net = xshard::compile<T>(decoder(mode == "sharding_propagation"), mesh, {.seed = 1},
                                  xshard::input<std::int64_t>("ids", {8 * sequence}));
    xshard::auto_parallel parallel_net(net, mesh, mode); // raises for an unknown mode
    nn::parallel_cross_entropy<T, mesh_2d> loss;
    xshard::optim::adamw optimizer({.lr = 3e-3, .weight_decay = 0.01});
    xshard::trainer trainer(parallel_net, loss, optimizer); // compile(): the search
    if (mesh.rank() == 0)
        std::printf("train_transformer %s on mesh(%s):\n%s", mode.c_str(),
                    mesh.shape().to_string().c_str(),
                    parallel_net.searched_program()->explain().c_str());
    std::int64_t first = 0;
    if (!ckpt.resume.empty()) {
        // The weights and AdamW's moments and step count, laid out for this mesh.
        first = trainer.load_checkpoint(ckpt.resume).step;
        if (mesh.rank() == 0)
            std::printf("resumed from %s at step %lld\n", ckpt.resume.c_str(),
                        static_cast<long long>(first));
    }
    const std::string path = ckpt.directory + "/train_transformer.safetensors";
    if (ckpt.every > 0 && mesh.rank() == 0)
        std::filesystem::create_directories(ckpt.directory);
    train_steps(mesh, batches, first, steps, [&](const windows_t& windows, std::int64_t step) {
        const auto [ids, targets] = tokens_of(windows);
        const double loss = trainer.train_step(ids, targets);
        if (ckpt.every > 0 && step % ckpt.every == 0) {
            trainer.save_checkpoint(path, step);
            if (mesh.rank() == 0)
                std::printf("saved %s at step %lld\n", path.c_str(), static_cast<long long>(step));
        }
        return loss;
    });
    return 0;
}

/// The example itself; main reports its errors.
int run(int argc, char** argv) {
    std::string text = "README.md", mode = "semi_auto";
    int tp = 0;
    std::int64_t steps = 200;
    checkpointing ckpt;
    bool checkpoint_options = false;
    std::string crossovers = "default";
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--text")
            text = argv[i + 1];
        else if (a == "--tp")
            tp = std::atoi(argv[i + 1]);
        else if (a == "--steps")
            steps = std::atoll(argv[i + 1]);
        else if (a == "--mode")
            mode = argv[i + 1];
        else if (a == "--crossovers")
            crossovers = argv[i + 1];
        else if (a == "--checkpoint-every" || a == "--checkpoint-dir" || a == "--resume") {
            checkpoint_options = true;
            if (a == "--checkpoint-every")
                ckpt.every = std::atoll(argv[i + 1]);
            else
                (a == "--resume" ? ckpt.resume : ckpt.directory) = argv[i + 1];
        }
    }
    if (checkpoint_options && mode == "semi_auto")
        throw xshard::error("train_transformer: --checkpoint-every, --checkpoint-dir and --resume "
                            "are for the driver's modes (--mode recursive_programming or "
                            "sharding_propagation)");
    if (crossovers != "default" && crossovers != "fit")
        throw xshard::error("train_transformer: --crossovers takes fit or default, not " +
                            crossovers);
    const int world = xshard::communicator::world().size();
    const mesh_2d mesh({xshard::auto_size, tp > 0 ? tp : world % 2 == 0 ? 2 : 1});
    if (crossovers == "fit") {
        const auto fit = xshard::calibrate_reduce_tuning(mesh.comm());
        xshard::use_reduce_crossovers(fit.tuning);
        if (mesh.rank() == 0)
            std::printf("fitted crossovers: the pairwise all-reduce from pieces of %zu bytes, "
                        "the pairwise reduce-scatter from %zu\n",
                        fit.tuning.min_piece_bytes, fit.tuning.reduce_scatter_min_piece_bytes);
    }

    const auto corpus = data::text_corpus::from_file(text, sequence);
    const data::loader batches(mesh, corpus, {.batch_size = 8, .seed = 5});
    if (mode != "semi_auto")
        return run_searched(mesh, batches, steps, mode, ckpt);
    gpt model(mesh);
    xshard::optim::adamw optimizer({.lr = 3e-3, .weight_decay = 0.01});
    const xshard::optim::warmup_cosine schedule{
        .base_lr = 3e-3, .warmup_steps = 20, .total_steps = steps};
    if (mesh.rank() == 0)
        std::printf("train_transformer on mesh(%s): %zu layers, %zu heads, %zu features, %zu "
                    "windows of %zu "
                    "characters from %s\n",
                    mesh.shape().to_string().c_str(), layers, heads, features, corpus.size(),
                    sequence, text.c_str());
    train_steps(mesh, batches, 0, steps, [&](const windows_t& windows, std::int64_t) {
        const T loss = model.forward(windows);
        model.backward();
        auto grads = xshard::gradients_of{model};
        xshard::synchronize_gradients(model, grads);
        xshard::clip_by_global_norm(grads, 1.0);
        optimizer.step(model, schedule(optimizer.steps()));
        xshard::for_each_weight(model, [](const std::string&, auto& w) { w.zero_grad(); });
        return double(loss);
    });
    return 0;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    return xshard::report_errors([&] { return run(argc, argv); });
}
