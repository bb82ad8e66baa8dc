#pragma once
/// \file
/// Training over parameter containers: parameters, weights, their traversal and deferred
/// shard-local initialisation (param/), parameter broadcast, gradient synchronisation and
/// fusion, optimizer sharding (`hsdp`), gradient norms and the loss monitor (train/),
/// optimizers and learning-rate schedules (optim/).

#include <xshard/optim/optimizers.hpp>
#include <xshard/optim/schedules.hpp>
#include <xshard/param/initializer.hpp>
#include <xshard/param/no_init.hpp>
#include <xshard/param/parameter.hpp>
#include <xshard/param/tensor_record.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/param/weight.hpp>
#include <xshard/train/broadcast.hpp>
#include <xshard/train/buckets.hpp>
#include <xshard/train/fusion.hpp>
#include <xshard/train/gradients.hpp>
#include <xshard/train/hsdp.hpp>
#include <xshard/train/hsdp_entry.hpp>
#include <xshard/train/hsdp_exchange.hpp>
#include <xshard/train/hsdp_group.hpp>
#include <xshard/train/hsdp_options.hpp>
#include <xshard/train/hsdp_spaces.hpp>
#include <xshard/train/hsdp_timings.hpp>
#include <xshard/train/hsdp_units.hpp>
#include <xshard/train/hsdp_views.hpp>
#include <xshard/train/lay_out.hpp>
#include <xshard/train/monitor.hpp>
#include <xshard/train/norms.hpp>
