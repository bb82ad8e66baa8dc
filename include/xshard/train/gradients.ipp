#pragma once
/// \file
/// The definitions of what train/gradients.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/train/gradients.hpp>

namespace xshard {

XSHARD_DECL void gradient_synchronizer::synchronize() {
    for (std::size_t k = 0; k < buckets_.size(); ++k)
        run(k, false);
    finish();
}

XSHARD_DECL void gradient_synchronizer::ready(std::string_view name) {
    const auto it =
        std::find_if(refs_.begin(), refs_.end(), [&](const auto& r) { return r.name == name; });
    if (it == refs_.end())
        throw error("xshard: gradient_synchronizer::ready: no gradient '" + std::string(name) +
                    "'");
    const auto i = std::size_t(it - refs_.begin());
    if (bucket_of_[i] >= 0) {
        const auto k = std::size_t(bucket_of_[i]);
        if (++waiting_[k] == buckets_[k].members.size() && !shared_[k])
            run(k, true);
    }
    for (auto& r : requests_) // let MPI progress what is in flight
        (void)r.test();
}

XSHARD_DECL void gradient_synchronizer::wait() {
    for (std::size_t k = 0; k < buckets_.size(); ++k)
        if (!started_[k])
            run(k, true);
    finish();
}

XSHARD_DECL std::size_t gradient_synchronizer::node_staging_bytes() const {
    std::size_t b = 0;
    for (const auto& [type, r] : reducers_)
        b += r.staging(r.reducer.get());
    return b;
}

XSHARD_DECL void gradient_synchronizer::plan(std::vector<const typed_steps*> steps,
                                             bool same_names) {
    std::optional<std::string> problem = detail::first_problem(refs_);
    if (!problem && std::find(steps.begin(), steps.end(), nullptr) != steps.end())
        problem = gradient_elements;
    if (!problem)
        problem = options_.fusion.allreduce.problem(refs_.size());
    if (!problem && !same_names)
        problem =
            "xshard: synchronize_gradients: the gradients do not have the parameters' names";
    agree_on_error(*refs_.front().mesh_comm, problem);
    // Buckets in reverse order: the backward pass produces the last layers' gradients first.
    std::vector<std::size_t> chosen;
    for (std::size_t i = refs_.size(); i-- > 0;)
        if (refs_[i].mesh.group_size(refs_[i].replicated) > 1)
            chosen.push_back(i);
    // index mode: the segment of the parameter's index is part of the key (buckets never
    // cross a boundary); it is 0 in the other modes.
    const auto& fusion = options_.fusion.allreduce;
    buckets_ = detail::make_buckets<std::tuple<std::size_t, std::uint32_t, std::type_index>>(
        refs_, chosen, fusion.bytes(), [&](std::size_t i) {
            return std::tuple(fusion.segment(i), refs_[i].replicated.bits, refs_[i].type);
        });
    bucket_of_.assign(refs_.size(), -1);
    shared_.assign(buckets_.size(), 0);
    finished_.assign(buckets_.size(), 0);
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
        for (std::size_t i : buckets_[k].members)
            bucket_of_[i] = int(k);
        const auto& first = refs_[buckets_[k].members.front()];
        steps_.push_back(steps[buckets_[k].members.front()]);
        const bool widen = options_.fp32_communication && first.element == 2;
        // Whether the bucket's group shares a node (collective over the group, the
        // buckets in the same order on every member).
        if (options_.shared_memory)
            shared_[k] = (this->*steps_[k]->shares_node)(*first.group);
        // No buffer for a bucket reduced on its gradients: one parameter, or several
        // through shared memory, in their own type.
        const bool unpacked = !widen && (buckets_[k].members.size() == 1 || shared_[k]);
        const std::size_t size = unpacked ? 0
                                          : buckets_[k].bytes / first.element *
                                                (widen ? sizeof(float) : first.element);
        buffers_.emplace_back(size);
    }
    waiting_.assign(buckets_.size(), 0);
    started_.assign(buckets_.size(), 0);
    requests_.resize(buckets_.size());
}

XSHARD_DECL void gradient_synchronizer::run(std::size_t k, bool nonblocking) {
    refresh_(false);
    waiting_[k] = buckets_[k].members.size();
    started_[k] = 1;
    (this->*steps_[k]->reduce)(k, nonblocking);
}

XSHARD_DECL void gradient_synchronizer::finish() {
    wait_all(requests_);
    if (refresh_)
        refresh_(false);
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
        (this->*steps_[k]->unpack)(k);
        waiting_[k] = 0;
        started_[k] = 0;
    }
    if (refresh_)
        refresh_(true);
}

} // namespace xshard
