// Convolutional networks (JSON lines, harness.hpp):
//   resnet18_step_dp2_f32   a ResNet-18 training step (forward, backward, gradient all-reduce,
//                           Momentum) on a global batch of 64 32 x 32 images split over the
//                           ranks (local batch norm), vs `one_rank`: the same step on the whole
//                           batch on one rank.
//   resnet18_step_spatial2_f32  the same step on a batch of 8 256 x 256 images whose height
//                           is split over the ranks (spatial parallelism: halo exchange before
//                           every convolution and pooling, batch norm statistics all-reduced
//                           over the bands), vs `one_rank`; "halo_bytes_per_step" is what the
//                           halo steps handed to MPI in one step, forward and adjoint, summed
//                           over the ranks (`resnet::halo_bytes_sent()`).
//   resnet18_step_dp2_f32_sharded_update  the data-parallel step with the gradients
//                           reduce-scattered, Momentum on each rank's slice and the weights
//                           all-gathered (xshard::hsdp level2), vs `all_reduce`: the
//                           data-parallel step above (all-reduce, the whole update on every
//                           rank). What the driver's gradient_path chooses between.
//   The step cases also print "threads_per_rank" (set to 1 OpenMP/oneDNN and 1 OpenBLAS
//                           thread by the benchmark, on both sides) and "phases" /
//                           "baseline_phases": each part's seconds per step (benchmarks/README.md).
//   conv2d_local_f32[_<shape>]  xshard's local convolution (forward, backward to the input and
//                           to the weights) vs `onednn_direct`: oneDNN's primitives called
//                           directly on the same NCHW shapes, built once. On planes under 8 x 8
//                           xshard takes its batched im2col + GEMM instead (conv_kernels.hpp).
#include <xshard/comm/environment.hpp>
#include <xshard/nn/resnet.hpp>
#include <xshard/nn/step_profile.hpp>
#include <xshard/optim/optimizers.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/train/gradients.hpp>
#include <xshard/train/hsdp.hpp>

#include "harness.hpp"

#include <xtensor/xrandom.hpp>

#include <dlfcn.h>

#include <array>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace bench = xshard::bench;
namespace nn = xshard::nn;
namespace ops = xshard::ops;
using mesh_t = xshard::mesh<"dp", "mp">;
using T = float;

namespace {

/// Threads per rank, set explicitly (not left to the environment): one OpenMP thread (oneDNN
/// runs on OpenMP here) and one OpenBLAS thread, on the 2-rank case and on the one-rank
/// baseline alike. Looked up at run time (both libraries are loaded with xshard; an absent
/// one is reported as 0). Returns the JSON field reporting what the libraries then say.
std::string one_thread_per_rank() {
    using set_fn = void (*)(int);
    using get_fn = int (*)();
    auto set = [](const char* name) {
        if (auto f = reinterpret_cast<set_fn>(dlsym(RTLD_DEFAULT, name)))
            f(1);
    };
    auto get = [](const char* name) {
        const auto f = reinterpret_cast<get_fn>(dlsym(RTLD_DEFAULT, name));
        return f ? f() : 0;
    };
    set("omp_set_num_threads");
    set("openblas_set_num_threads");
    return "\"threads_per_rank\": {\"openmp_onednn\": " +
           std::to_string(get("omp_get_max_threads")) +
           ", \"openblas\": " + std::to_string(get("openblas_get_num_threads")) + "}";
}

/// Seconds of one step's parts on this rank (see `phase_json`).
struct phases {
    double forward = 0, backward = 0, gradient_sync = 0, optimizer = 0;
    std::array<double, std::size_t(nn::step_part::count_)> parts{};
};

/// A training step of `net` on x with a fixed logits gradient, as a training loop runs it:
/// forward, backward, gradient all-reduce (the synchronizer planned once, its bucket and
/// buffer reused every step), Momentum, gradients zeroed. `mean`: the gradients averaged
/// over the replicas (data parallel), else summed (the bands' terms, spatial). `sharded`:
/// the gradients reduce-scattered, the update on this rank's slice, the weights all-gathered
/// (xshard::hsdp level2; "gradient_sync" is then the reduce-scatter, "optimizer" the update
/// and the all-gather). With `timed`, the step's parts are written there (nn::step_profile
/// on for the layers' parts).
template <class Net>
struct trainer {
    Net& net;
    const nn::tensor<T, mesh_t, 4>& x;
    xshard::optim::momentum& opt;
    bool mean = true;
    bool sharded = false;
    xshard::gradients_of<Net> grads{net};
    std::optional<xshard::gradient_synchronizer> sync{};
    std::unique_ptr<xshard::hsdp<Net>> sharding{};

    void operator()(phases* timed = nullptr) {
        if (timed) {
            nn::step_profile::reset();
            nn::step_profile::enabled = true;
        }
        const double t0 = MPI_Wtime();
        const auto y = net.forward(x);
        const double t1 = MPI_Wtime();
        auto dy = y;
        dy.local().fill(T(1e-3));
        net.backward(nn::as_gradient(dy));
        const double t2 = MPI_Wtime();
        if (!sync && !sharding) { // after the first backward pass: the gradients exist
            // One fusion bucket for ResNet-18's 44.7 MB of gradients (comm_fusion size mode,
            // 64 MiB): the all-reduce runs after the backward pass, where buckets overlap
            // nothing and each adds its rounds of messages (4 MiB buckets: 11 all-reduces).
            xshard::gradient_options go{.mean = mean};
            go.fusion.allreduce.how = xshard::fusion_threshold::mode::size;
            go.fusion.allreduce.threshold_mib = 64;
            if (sharded)
                sharding = std::make_unique<xshard::hsdp<Net>>(
                    net, xshard::hsdp_options{.optimizer_level = xshard::optimizer_level::level2},
                    go);
            else
                sync.emplace(net, grads, go);
        }
        if (sharding)
            sharding->synchronize_gradients();
        else
            sync->synchronize();
        const double t3 = MPI_Wtime();
        if (sharding)
            sharding->step(opt);
        else
            opt.step(net);
        xshard::for_each_weight(net, [](const std::string&, auto& w) { w.zero_grad(); });
        const double t4 = MPI_Wtime();
        if (timed) {
            nn::step_profile::enabled = false;
            *timed = {t1 - t0, t2 - t1, t3 - t2, t4 - t3, nn::step_profile::totals};
        }
    }
};

/// `{"forward": s, ..., "halo": s}`: the median over repetitions of each part's seconds, the
/// slowest rank's.
std::string phase_json(const xshard::communicator& world, const std::vector<phases>& reps) {
    std::vector<std::string> names{"forward", "backward", "gradient_sync", "optimizer"};
    for (const char* n : nn::step_part_names)
        names.emplace_back(n);
    std::string out = "{";
    for (std::size_t k = 0; k < names.size(); ++k) {
        std::vector<double> v;
        for (const auto& p : reps) {
            const std::array<double, 4> head{p.forward, p.backward, p.gradient_sync, p.optimizer};
            v.push_back(k < 4 ? head[k] : p.parts[k - 4]);
        }
        for (auto& s : v)
            xshard::mpi::allreduce(world, std::span(&s, 1), xshard::reduction::max);
        char buf[64];
        std::snprintf(buf, sizeof buf, "%s\"%s\": %.4g", k ? ", " : "", names[k].c_str(),
                      bench::median(v));
        out += buf;
    }
    return out + "}";
}

/// The parts of the candidate's and the baseline's steps, interleaved (3 repetitions, 1 with
/// --quick): JSON fields "phases" and "baseline_phases".
template <class F, class G>
std::string phase_fields(const xshard::communicator& world, const bench::options& o, F& candidate,
                         G& baseline) {
    std::vector<phases> a, b;
    for (int r = 0; r < (o.quick ? 1 : 3); ++r) {
        xshard::mpi::barrier(world);
        candidate(&a.emplace_back());
        xshard::mpi::barrier(world);
        baseline(&b.emplace_back());
    }
    return "\"phases\": " + phase_json(world, a) + ", \"baseline_phases\": " + phase_json(world, b);
}

/// ResNet-18 on a mesh of the world and on one rank, each with its optimizer, and one batch of
/// random images (batch x 3 x S x S) laid out as `spec` on the mesh and whole on one rank.
struct resnet_case {
    mesh_t mesh, one;
    xt::xtensor<T, 4> gx;
    nn::resnet<T, mesh_t, nn::basic_block> net, serial;
    nn::tensor<T, mesh_t, 4> x, sx;
    xshard::optim::momentum a{{.lr = 0.01, .momentum = 0.9}}, b{{.lr = 0.01, .momentum = 0.9}};

    resnet_case(const xshard::communicator& world, std::array<int, 2> shape, std::size_t batch,
                std::size_t S, std::initializer_list<std::string> spec)
        : mesh(world, shape)
        , one(xshard::communicator::self(), {1, 1})
        , gx(images(batch, S))
        , net(nn::resnet18<T>(mesh, 10))
        , serial(nn::resnet18<T>(one, 10))
        , x(xshard::distribute<xshard::dynamic_layout(4)>(mesh, gx, nn::make_layout(spec)))
        , sx(xshard::distribute<xshard::dynamic_layout(4)>(one, gx,
                                                           nn::make_layout({"", "", "", ""}))) {}

    static xt::xtensor<T, 4> images(std::size_t batch, std::size_t S) {
        std::mt19937 e(1);
        return xt::random::rand<T>(std::array<std::size_t, 4>{batch, 3, S, S}, T(-1), T(1), e);
    }
};

/// The gradients' one fused bucket is reduced on the gradients through shared memory (the
/// ranks share the node; train/gradients.hpp). A case with a node storage open, which made
/// the bucket's buffer node-shared, was dropped: nothing is packed any more, so it ran the
/// same path (benchmarks/README.md).
void resnet_step(const xshard::communicator& world, const bench::options& o,
                 const std::string& threads) {
    // Batch norm with each rank's statistics (MindSpore's data-parallel default): no
    // collective in the forward and backward passes, only the gradient all-reduce.
    resnet_case r(world, {world.size(), 1}, o.quick ? 8 : 64, o.quick ? 16 : 32,
                  {"dp", "", "", ""});
    trainer<decltype(r.net)> step{r.net, r.x, r.a};
    trainer<decltype(r.serial)> serial{r.serial, r.sx, r.b};
    const auto t = bench::compare(
        world, o, [&] { step(); }, [&] { serial(); });
    bench::report(world, "resnet18_step_dp" + std::to_string(world.size()) + "_f32",
                  r.gx.size() * sizeof(T), "one_rank", t,
                  threads + ", " + phase_fields(world, o, step, serial));
}

/// The data-parallel step with the update sharded (reduce-scatter, the slice's Momentum,
/// all-gather) against the same step with the all-reduce and the whole update.
void resnet_step_sharded_update(const xshard::communicator& world, const bench::options& o,
                                const std::string& threads) {
    resnet_case r(world, {world.size(), 1}, o.quick ? 8 : 64, o.quick ? 16 : 32,
                  {"dp", "", "", ""});
    nn::resnet<T, mesh_t, nn::basic_block> plain = nn::resnet18<T>(r.mesh, 10);
    xshard::optim::momentum c{{.lr = 0.01, .momentum = 0.9}};
    trainer<decltype(r.net)> step{r.net, r.x, r.a, true, true};
    trainer<decltype(plain)> baseline{plain, r.x, c};
    const auto t = bench::compare(
        world, o, [&] { step(); }, [&] { baseline(); });
    bench::report(world, "resnet18_step_dp" + std::to_string(world.size()) + "_f32_sharded_update",
                  r.gx.size() * sizeof(T), "all_reduce", t,
                  threads + ", " + phase_fields(world, o, step, baseline));
}

void resnet_step_spatial(const xshard::communicator& world, const bench::options& o,
                         const std::string& threads) {
    resnet_case r(world, {1, world.size()}, o.quick ? 2 : 8, o.quick ? 64 : 256,
                  {"", "", "mp", ""});
    trainer<decltype(r.net)> step{r.net, r.x, r.a, false};
    trainer<decltype(r.serial)> serial{r.serial, r.sx, r.b};
    step(); // plans the halos
    const std::size_t before = r.net.halo_bytes_sent();
    step();
    double halo = double(r.net.halo_bytes_sent() - before); // summed over the ranks
    xshard::mpi::allreduce(world, std::span(&halo, 1), xshard::reduction::sum);
    const auto t = bench::compare(
        world, o, [&] { step(); }, [&] { serial(); });
    bench::report(world, "resnet18_step_spatial" + std::to_string(world.size()) + "_f32",
                  r.gx.size() * sizeof(T), "one_rank", t,
                  "\"halo_bytes_per_step\": " + std::to_string(std::size_t(halo)) + ", " + threads +
                      ", " + phase_fields(world, o, step, serial));
}

/// oneDNN's convolution primitives on NCHW memory, built once: the peer of the local kernels.
struct direct {
    dnnl::engine eng{dnnl::engine::kind::cpu, 0};
    dnnl::stream s{eng};
    dnnl::memory src, wei, dst, dsrc, dwei;
    dnnl::convolution_forward fwd;
    dnnl::convolution_backward_data bwd_data;
    dnnl::convolution_backward_weights bwd_weights;

    direct(const ops::conv2d_geometry& g, T* x, T* w, T* y, T* dx, T* dw) {
        using tag = dnnl::memory::format_tag;
        using dt = dnnl::memory::data_type;
        auto d = [](std::size_t v) {
            return dnnl::memory::dim(v);
        };
        const dnnl::memory::desc sm({d(g.batch), d(g.in_channels), d(g.in_h), d(g.in_w)}, dt::f32,
                                    tag::nchw);
        const dnnl::memory::desc dm({d(g.batch), d(g.out_channels), d(g.out_h()), d(g.out_w())},
                                    dt::f32, tag::nchw);
        const dnnl::memory::desc wm(
            {d(g.out_channels), d(g.in_channels), d(g.kernel_h), d(g.kernel_w)}, dt::f32,
            tag::oihw);
        const dnnl::memory::dims st{d(g.stride_h), d(g.stride_w)},
            dil{d(g.dilation_h) - 1, d(g.dilation_w) - 1}, pl{d(g.pad.top), d(g.pad.left)},
            pr{d(g.pad.bottom), d(g.pad.right)};
        const dnnl::convolution_forward::primitive_desc fpd({dnnl::prop_kind::forward_training,
                                                             dnnl::algorithm::convolution_direct,
                                                             sm, wm, dm, st, dil, pl, pr},
                                                            eng);
        fwd = dnnl::convolution_forward(fpd);
        bwd_data = dnnl::convolution_backward_data(dnnl::convolution_backward_data::primitive_desc(
            {dnnl::algorithm::convolution_direct, sm, wm, dm, st, dil, pl, pr}, eng, fpd));
        bwd_weights =
            dnnl::convolution_backward_weights(dnnl::convolution_backward_weights::primitive_desc(
                {dnnl::algorithm::convolution_direct, sm, wm, dm, st, dil, pl, pr}, eng, fpd));
        src = dnnl::memory(sm, eng, x);
        wei = dnnl::memory(wm, eng, w);
        dst = dnnl::memory(dm, eng, y);
        dsrc = dnnl::memory(sm, eng, dx);
        dwei = dnnl::memory(wm, eng, dw);
    }
    void operator()() {
        fwd.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
        bwd_data.execute(
            s, {{DNNL_ARG_DIFF_DST, dst}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, dsrc}});
        bwd_weights.execute(
            s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, dst}, {DNNL_ARG_DIFF_WEIGHTS, dwei}});
        s.wait();
    }
};

void conv_local(const xshard::communicator& world, const bench::options& o, const std::string& name,
                std::size_t n, std::size_t c, std::size_t hw, std::size_t out, std::size_t stride) {
    ops::conv2d_geometry g;
    g.batch = o.quick ? 2 : n, g.in_channels = c, g.in_h = g.in_w = hw, g.out_channels = out;
    g.kernel_h = g.kernel_w = 3, g.stride_h = g.stride_w = stride,
    g.pad = ops::padding2d::uniform(1);
    std::mt19937 e(2);
    std::uniform_real_distribution<T> u(-1, 1);
    auto fill = [&](std::size_t k) {
        std::vector<T> v(k);
        for (auto& x : v)
            x = u(e);
        return v;
    };
    auto x = fill(xshard::volume(g.input_shape())), w = fill(xshard::volume(g.weight_shape())),
         y = fill(xshard::volume(g.output_shape()));
    std::vector<T> dx(x.size()), dw(w.size()), y2(y.size()), dx2(x.size()), dw2(w.size());
    direct peer(g, x.data(), w.data(), y2.data(), dx2.data(), dw2.data());
    auto mine = [&] {
        ops::conv2d_forward(x.data(), w.data(), y.data(), g);
        ops::conv2d_backward_input(y.data(), w.data(), dx.data(), g);
        ops::conv2d_backward_weight(x.data(), y.data(), dw.data(), g);
    };
    const auto t = bench::compare(world, o, mine, peer);
    bench::report(world, name, x.size() * sizeof(T), "onednn_direct", t);
}

} // namespace

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const auto o = bench::options::parse(argc, argv);
    const auto world = xshard::communicator::world();
    const auto threads = one_thread_per_rank();
    if (o.wants("conv2d_local_f32"))
        conv_local(world, o, "conv2d_local_f32", 32, 64, 16, 64, 1); // oneDNN's regime
    if (o.wants("conv2d_local_f32_4x4"))
        conv_local(world, o, "conv2d_local_f32_4x4", 32, 256, 4, 256, 1); // the GEMM's
    if (o.wants("resnet18_step_dp" + std::to_string(world.size()) + "_f32"))
        resnet_step(world, o, threads);
    if (o.wants("resnet18_step_dp" + std::to_string(world.size()) + "_f32_sharded_update"))
        resnet_step_sharded_update(world, o, threads);
    if (o.wants("resnet18_step_spatial"))
        resnet_step_spatial(world, o, threads);
    return 0;
}
