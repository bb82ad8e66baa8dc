// Parameter broadcast on a 2 x 2 mesh (dp x mp): a small model of modules with data-parallel
// (replicated) and model-parallel (split over mp) parameters. Every rank starts from its own
// random values; after the broadcast every redundant copy holds its owner's values. The
// example prints which rank owned which parameter and checks that all copies agree.
//
//   mpirun -n 4 build/examples/parameter_broadcast
#include <xshard/core.hpp>
#include <xshard/tensor.hpp>
#include <xshard/train.hpp>

#include <cstdio>
#include <string>

using mesh_2d = xshard::mesh<"dp", "mp">;

struct dense {
    xshard::dtensor<double, mesh_2d, "[-, mp]"> weight; // model parallel: split by columns
    xshard::dtensor<double, mesh_2d, "[mp]"> bias;
    friend void visit_parameters(dense& d, auto&& visit) {
        visit("weight", d.weight);
        visit("bias", d.bias);
    }
};

struct net {
    xshard::dtensor<double, mesh_2d, "[-, -]"> embedding; // data parallel: replicated everywhere
    dense dense1, dense2;
    xshard::dtensor<float, mesh_2d, "[-]"> scale;
    friend void visit_parameters(net& n, auto&& visit) {
        visit("embedding", n.embedding);
        visit("dense1", n.dense1);
        visit("dense2", n.dense2);
        visit("scale", n.scale);
    }
};

/// The example itself; main reports its errors.
int run() {
    const int world = xshard::communicator::world().size();
    const mesh_2d mesh({xshard::auto_size, world % 2 == 0 ? 2 : 1});
    // Different random values on every rank (the seed is the rank).
    const unsigned seed = unsigned(mesh.rank()) + 1;
    net model{xshard::rand<double, "[-, -]">(mesh, {16, 8}, seed),
              {xshard::rand<double, "[-, mp]">(mesh, {8, 12}, seed),
               xshard::rand<double, "[mp]">(mesh, {12}, seed)},
              {xshard::rand<double, "[-, mp]">(mesh, {12, 4}, seed),
               xshard::rand<double, "[mp]">(mesh, {4}, seed)},
              xshard::rand<float, "[-]">(mesh, {3}, seed)};

    const auto report = xshard::parameter_broadcast(model, {.cur_rank = mesh.rank()});

    // Check: gathering each parameter on every rank must give one value per element,
    // whichever rank's copy is read: compare each rank's shard with the gathered tensor.
    bool agree = true;
    std::string table;
    xshard::for_each_parameter(model, [&](const std::string& name, const auto& t) {
        const auto full = xshard::gather_all(t);
        const auto b = t.block();
        for (std::size_t i = 0; i < t.local().size(); ++i) {
            std::array<std::size_t, std::remove_cvref_t<decltype(t)>::rank> idx{};
            std::size_t rest = i;
            for (std::size_t d = idx.size(); d-- > 0;) {
                idx[d] = b.offset[d] + rest % b.extent[d];
                rest /= b.extent[d];
            }
            agree = agree && full[idx] == t.local().data()[i];
        }
        // Every copy equals the copy the owner holds: all-reduce the min and max.
        double lo = 0, hi = 0;
        for (const auto& x : t.local()) {
            lo += double(x);
            hi += double(x);
        }
        const auto& group = t.mesh().sub(t.layout().replicated_axes(t.mesh().shape()));
        xshard::mpi::allreduce(group, std::span(&lo, 1), xshard::reduction::min);
        xshard::mpi::allreduce(group, std::span(&hi, 1), xshard::reduction::max);
        agree = agree && lo == hi;
        const int owner = report.owner.at(name);
        table +=
            "  " + name + " " + t.layout().to_string() + ": " +
            (owner < 0 ? std::string("not redundant") : "owner rank " + std::to_string(owner)) +
            "\n";
    });
    int ok = agree ? 1 : 0;
    xshard::mpi::allreduce(mesh.comm(), std::span(&ok, 1), xshard::reduction::min);
    if (mesh.rank() == 0) {
        std::printf("parameter broadcast on mesh(%s), rank 0's groups:\n%s",
                    mesh.shape().to_string().c_str(), table.c_str());
        std::printf("bytes originated per rank:");
        for (auto b : report.bytes_owned)
            std::printf(" %zu", b);
        std::printf("\n%zu broadcasts (fused buckets); every copy agrees with its owner: %s\n",
                    report.buckets, ok ? "ok" : "WRONG");
    }
    return ok ? 0 : 1;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    return xshard::report_errors([&] { return run(); });
}
