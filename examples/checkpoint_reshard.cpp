// Save on one strategy, resume on another: a linear regression trained with momentum SGD
// for 5 steps on 4 ranks (mesh dp=2 x mp=2, the weight split by columns), checkpointed with
// its optimizer state, then resumed on 2 ranks (mesh dp=1 x mp=2, the weight split by rows
// now) for 5 more steps. The loss resumes where it stopped, and every loss equals that of an
// uninterrupted serial run.
//
//   mpirun -n 4 build/examples/checkpoint_reshard train  /tmp/ckpt
//   mpirun -n 2 build/examples/checkpoint_reshard resume /tmp/ckpt
#include <xshard/core.hpp>
#include <xshard/io.hpp>
#include <xshard/ops.hpp>
#include <xshard/tensor.hpp>

#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xrandom.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

using mesh_2d = xshard::mesh<"dp", "mp">;
using matrix = xshard::dtensor<double, mesh_2d, xshard::dynamic_layout(2)>;

constexpr std::size_t samples = 256, features = 64, outputs = 16;
constexpr double learning_rate = 0.05, momentum = 0.9;
constexpr int steps_per_run = 5;

/// The data, the same on every rank: inputs and the targets of a hidden linear map.
struct dataset {
    xt::xtensor<double, 2> x, y;
    dataset() {
        std::mt19937 engine(42);
        x = xt::random::randn<double>({samples, features}, 0.0, 1.0, engine);
        const xt::xtensor<double, 2> truth =
            xt::random::randn<double>({features, outputs}, 0.0, 1.0, engine);
        y = xt::linalg::dot(x, truth);
    }
};

/// The losses of `steps` steps of momentum SGD from zero weights, serially: the reference.
std::vector<double> serial_losses(const dataset& d, int steps) {
    xt::xtensor<double, 2> w = xt::zeros<double>({features, outputs}), v = w;
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) {
        const xt::xtensor<double, 2> r = xt::linalg::dot(d.x, w) - d.y;
        losses.push_back(xt::mean(r * r)());
        v = momentum * v +
            xt::linalg::dot(xt::transpose(d.x), r) * (2.0 / double(samples * outputs));
        w -= learning_rate * v;
    }
    return losses;
}

/// The model and its optimizer state, laid out for one strategy.
struct model {
    matrix weight, velocity;
    friend void visit_parameters(model& m, auto&& visit) { visit("weight", m.weight); }
};
struct optimizer_state {
    model* m;
    friend void visit_parameters(optimizer_state& s, auto&& visit) {
        visit("velocity.weight", s.m->velocity);
    }
};

/// One step: the loss at the current weights, then the momentum update. The products
/// follow the weight's layout (xshard's matmul rule), and their pending sums are resolved.
double step(model& m, const matrix& x, const matrix& y) {
    const auto prediction = xshard::ops::resolve(xshard::ops::matmul(x, m.weight));
    const auto residual = xshard::ops::sub(
        xshard::redistribute<xshard::dynamic_layout(2)>(prediction, y.layout()), y);
    const double loss =
        xshard::ops::resolve(
            xshard::ops::mean<0>(xshard::ops::mean<1>(xshard::ops::mul(residual, residual))))
            .local()();
    const auto gradient = xshard::redistribute<xshard::dynamic_layout(2)>(
        xshard::ops::resolve(xshard::ops::matmul(xshard::ops::transpose<1, 0>(x), residual)),
        m.weight.layout());
    // Same layouts: the update is local.
    m.velocity.local() =
        momentum * m.velocity.local() + gradient.local() * (2.0 / double(samples * outputs));
    m.weight.local() -= learning_rate * m.velocity.local();
    return loss;
}

/// The example itself; main reports its errors.
int run(int argc, char** argv) {
    if (argc != 3 || (std::string(argv[1]) != "train" && std::string(argv[1]) != "resume")) {
        std::fprintf(stderr, "usage: checkpoint_reshard train|resume DIRECTORY\n");
        return 2;
    }
    const bool resume = std::string(argv[1]) == "resume";
    const std::string path = std::string(argv[2]) + "/model.safetensors";
    const int world = xshard::communicator::world().size();

    // train: the weight split by columns, the batch by dp. resume: the weight split by rows,
    // the inputs by columns (a contraction split over mp: matmul leaves a pending sum).
    const mesh_2d mesh({xshard::auto_size, world % 2 == 0 ? 2 : 1});
    const xshard::layout w_layout = resume ? "[mp, -]" : "[-, mp]";
    const xshard::layout x_layout = resume ? "[dp, mp]" : "[dp, -]";
    const xshard::layout y_layout = resume ? "[dp, -]" : "[dp, mp]";
    const dataset data;
    const auto x = xshard::distribute<xshard::dynamic_layout(2)>(mesh, data.x, x_layout);
    const auto y = xshard::distribute<xshard::dynamic_layout(2)>(mesh, data.y, y_layout);
    model m{xshard::zeros<double, xshard::dynamic_layout(2)>(mesh, {features, outputs}, w_layout),
            xshard::zeros<double, xshard::dynamic_layout(2)>(mesh, {features, outputs}, w_layout)};
    optimizer_state state{&m};

    int first = 0;
    if (resume) {
        const auto info = xshard::load_checkpoint(path, m, state);
        first = int(info.step);
        if (mesh.rank() == 0)
            std::printf("resumed %s at step %d: saved on mesh(%s) with the weight %s, loaded on "
                        "mesh(%s) as %s\n",
                        path.c_str(), first, info.strategy.mesh.to_string().c_str(),
                        info.strategy.find("weight")->lay.to_string().c_str(),
                        mesh.shape().to_string().c_str(), m.weight.layout().to_string().c_str());
    } else if (mesh.rank() == 0) {
        std::printf("training on mesh(%s), the weight %s\n", mesh.shape().to_string().c_str(),
                    m.weight.layout().to_string().c_str());
    }
    const auto reference = serial_losses(data, first + steps_per_run);
    bool ok = true;
    for (int s = first; s < first + steps_per_run; ++s) {
        const double loss = step(m, x, y);
        const double error = std::abs(loss - reference[std::size_t(s)]) / reference[std::size_t(s)];
        ok = ok && error < 1e-10;
        if (mesh.rank() == 0)
            std::printf("step %2d  loss %12.6f   uninterrupted serial run %12.6f\n", s + 1, loss,
                        reference[std::size_t(s)]);
    }
    if (!resume) {
        xshard::save_checkpoint(path, m, {.step = first + steps_per_run}, state);
        if (mesh.rank() == 0)
            std::printf("saved %s (step %d)\n", path.c_str(), first + steps_per_run);
    }
    if (mesh.rank() == 0)
        std::printf("%s\n",
                    ok ? "losses match the uninterrupted serial run: ok" : "losses differ: WRONG");
    return ok ? 0 : 1;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    return xshard::report_errors([&] { return run(argc, argv); });
}
