#pragma once
/// \file
/// The definitions of what search/evaluate_strategy.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/evaluate_strategy.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL std::vector<int> stage_split(std::size_t ops, int pp) {
    std::vector<int> s(ops);
    for (std::size_t i = 0; i < ops; ++i)
        s[i] = int(i * std::size_t(pp) / ops);
    return s;
}

XSHARD_DECL candidate_pricer::candidate_pricer(const network_spec& net, const parallel_degrees& d,
                                               const machine_model& m,
                                               redistribution_pricer& pricer)
    : net_(&net)
    , d_(d)
    , m_(&m)
    , pricer_(&pricer)
    , stage_of_(stage_split(net.ops.size(), d.pp)) {
    samples_ = net.batch / std::size_t(d.micro_batches);
    if (d.pp > 1) {
        const auto rep = pipeline::analyze(pipeline::schedule_config{
            pipeline::schedule_kind::one_f_one_b, d.pp, d.micro_batches, 1});
        in_flight_ = rep.peak_in_flight;
    } else {
        in_flight_ = {1};
    }
    slots_ = double(d.micro_batches + d.pp - 1);
    // A stage boundary: the [dp, -] block sent forward and its gradient back, per
    // micro-batch, point to point.
    const auto rows = largest_block(samples_ * net.seq, std::size_t(d.dp));
    boundary_bytes_.resize(net.ops.size() + 1, 0);
    for (std::size_t i = 1; i < net.ops.size(); ++i)
        if (stage_of_[i] != stage_of_[i - 1])
            boundary_bytes_[i] = rows * net.ops[i - 1].out * m.element;
}

XSHARD_DECL const op_cost& candidate_pricer::cost(std::size_t i, const op_choice& c) {
    const auto& op = net_->ops[i];
    const auto k = std::make_tuple(int(op.kind), op.in, op.out, op.bias, op.heads, int(c.in),
                                   int(c.weight), int(c.out));
    auto it = memo_.find(k);
    if (it == memo_.end())
        it = memo_.emplace(k, cost_of(op, c, samples_, net_->seq, d_.hsdp_level, *m_, *pricer_))
                 .first;
    return it->second;
}

XSHARD_DECL double candidate_pricer::boundary_seconds(std::size_t first, std::size_t last) const {
    double s = 0;
    const auto& link = m_->links.exchange;
    for (std::size_t b : {first, last})
        if (b > 0 && b < boundary_bytes_.size() - 1 && boundary_bytes_[b] > 0)
            s += link.alpha + link.beta * double(boundary_bytes_[b]);
    return s;
}

XSHARD_DECL double candidate_pricer::boundary_bytes(std::size_t first, std::size_t last) const {
    double s = 0;
    for (std::size_t b : {first, last})
        if (b > 0 && b < boundary_bytes_.size() - 1)
            s += double(boundary_bytes_[b]);
    return s;
}

XSHARD_DECL searched_strategy evaluate_strategy(const network_spec& net, const parallel_degrees& d,
                                                const std::vector<op_choice>& choices,
                                                const search_options& o, candidate_pricer& cp) {
    searched_strategy p;
    p.degrees = d;
    p.choices = choices;
    p.stage_of = cp.stage_of();
    const std::size_t n = net.ops.size();
    if (choices.size() != n)
        throw std::invalid_argument("xshard: evaluate_strategy: one choice per operator");
    std::vector<detail::stage_totals> st(std::size_t(d.pp));
    for (std::size_t i = 0; i < n; ++i) {
        const auto& c = choices[i];
        const bool first = i == 0 || p.stage_of[i] != p.stage_of[i - 1];
        const bool last = i + 1 == n || p.stage_of[i] != p.stage_of[i + 1];
        if ((i == 0 || first) && c.in != activation_split::rows)
            p.valid = false;
        if (i > 0 && !first && c.in != choices[i - 1].out)
            p.valid = false;
        if (last && i + 1 < n && c.out != activation_split::rows)
            p.valid = false;
        if (i + 1 == n && !o.output_allowed(c.out))
            p.valid = false;
        const auto& k = cp.cost(i, c);
        if (!k.valid)
            p.valid = false;
        auto& s = st[std::size_t(p.stage_of[i])];
        s.per_micro_batch += k.compute + k.communication;
        s.compute += k.compute;
        s.communication += k.communication;
        s.sync += k.synchronization;
        s.memory += double(k.weight_memory) +
                    double(cp.in_flight(p.stage_of[i])) * double(k.activation_memory);
        s.comm_bytes += double(d.micro_batches) * double(k.comm_bytes) + double(k.sync_bytes);
    }
    std::optional<search_key> worst;
    for (int s = 0; s < d.pp; ++s) {
        std::size_t first = n, last = 0;
        for (std::size_t i = 0; i < n; ++i)
            if (p.stage_of[i] == s) {
                first = std::min(first, i);
                last = i + 1;
            }
        const auto& t = st[std::size_t(s)];
        const double boundary = cp.boundary_seconds(first, last);
        const double step = cp.slots() * (t.per_micro_batch + boundary) + t.sync;
        const double comm = cp.slots() * (t.communication + boundary) + t.sync;
        const auto k = objective_of(o.level, step, comm, t.memory);
        p.memory_bytes = std::max(p.memory_bytes, t.memory);
        if (!worst || *worst < k) {
            worst = k;
            p.objective = k;
            p.step_seconds = step;
            p.compute_seconds = double(d.micro_batches) * t.compute;
            p.communication_seconds = double(d.micro_batches) * t.communication;
            p.synchronization_seconds = t.sync;
            p.pipeline_seconds = step - p.compute_seconds - p.communication_seconds - t.sync;
            p.comm_bytes =
                t.comm_bytes + double(d.micro_batches) * 2 * cp.boundary_bytes(first, last);
        }
    }
    p.fits = p.memory_bytes <= o.memory_per_rank;
    return p;
}

} // namespace detail

XSHARD_DECL searched_strategy evaluate_strategy(const network_spec& net, const parallel_degrees& d,
                                                const std::vector<op_choice>& choices,
                                                const search_options& o) {
    const mesh_shape mesh({axis_name("dp"), axis_name("tp")}, {d.dp, d.tp});
    redistribution_pricer pricer(mesh, o.machine.links, o.machine.element);
    detail::candidate_pricer cp(net, d, o.machine, pricer);
    return detail::evaluate_strategy(net, d, choices, o, cp);
}

} // namespace xshard

