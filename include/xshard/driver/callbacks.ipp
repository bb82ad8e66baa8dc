#pragma once
/// \file
/// The definitions of what driver/callbacks.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/driver/callbacks.hpp>

namespace xshard {

namespace callbacks {

XSHARD_DECL callback loss_monitor(std::size_t per_print_times, monitor_output out,
                                  int precision) {
    if (per_print_times == 0)
        throw error("xshard: loss_monitor: per_print_times must be a positive integer, not 0");
    auto monitor = std::make_shared<std::optional<xshard::loss_monitor>>();
    return {.on_train_begin =
                [=](const train_begin_info& t) {
                    monitor->emplace(*t.comm,
                                     loss_monitor_options{.steps_per_epoch = t.steps_per_epoch,
                                                          .epochs = t.epochs,
                                                          .print_every = per_print_times,
                                                          .out = out,
                                                          .precision = precision});
                },
            .on_step = [=](const step_info& s) { (*monitor)->step(s.loss, s.samples); },
            .on_epoch_end =
                [=](std::size_t) {
                    (*monitor)->end_epoch();
                }};
}

XSHARD_DECL callback model_checkpoint(checkpoint_config config) {
    if (config.save_checkpoint_steps == 0)
        throw error("xshard: model_checkpoint: save_checkpoint_steps must be a positive "
                    "integer, not 0");
    if (config.prefix.empty() || config.directory.empty())
        throw error("xshard: model_checkpoint: the prefix and the directory must not be empty");
    struct state {
        checkpoint_config config;
        train_begin_info begin{};
        std::deque<std::string> saved{};
    };
    auto s = std::make_shared<state>(state{std::move(config), {}, {}});
    return {.on_train_begin =
                [s](const train_begin_info& t) {
                    s->begin = t;
                    agreed<io_error>(*t.comm, [&] {
                        std::error_code ec;
                        std::filesystem::create_directories(s->config.directory, ec);
                        if (ec)
                            throw io_error("xshard: model_checkpoint: cannot create " +
                                           s->config.directory + " on rank " +
                                           std::to_string(t.comm->rank()) + ": " + ec.message());
                    });
                },
            .on_step =
                [s](const step_info& i) {
                    if (i.global_step % std::int64_t(s->config.save_checkpoint_steps) != 0)
                        return;
                    const bool integrated = s->config.integrated_save;
                    const std::string path = s->config.directory + "/" + s->config.prefix + "-" +
                                             std::to_string(i.epoch + 1) + "_" +
                                             std::to_string(i.global_step) +
                                             (integrated ? ".safetensors" : "");
                    s->begin.save_checkpoint(path, i.global_step,
                                             integrated ? checkpoint_format::integrated
                                                        : checkpoint_format::per_rank);
                    s->saved.push_back(path);
                    if (s->config.keep_checkpoint_max == 0 ||
                        s->saved.size() <= s->config.keep_checkpoint_max)
                        return;
                    const std::string old = s->saved.front();
                    s->saved.pop_front();
                    const auto& comm = *s->begin.comm;
                    agreed<io_error>(comm, [&] {
                        std::error_code ec;
                        if (comm.rank() == 0)
                            std::filesystem::remove_all(old, ec);
                        if (ec)
                            throw io_error("xshard: model_checkpoint: cannot remove " + old + ": " +
                                           ec.message());
                    });
                }};
}

} // namespace callbacks

} // namespace xshard

