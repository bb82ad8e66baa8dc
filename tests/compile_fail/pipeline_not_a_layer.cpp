#include <xshard/nn/linear.hpp>
#include <xshard/pipeline/pipeline.hpp>
// Must not compile: a module of a pipelined chain without a backward pass.
using M = xshard::mesh<"dp", "tp">;
using X = xshard::nn::tensor<double, M>;
struct forward_only {
    X forward(const X& x) { return x; }
    friend void visit_parameters(forward_only&, auto&&) {}
};
using model_t = xshard::nn::sequential<xshard::nn::column_parallel_linear<double, M>, forward_only>;
void f(const xshard::mesh<"pp", "dp", "tp">& mesh, const M& stage, model_t& model) {
    xshard::pipeline::pipeline<model_t, X> pipe(mesh, "pp", stage, model, {});
}
