"""The preflight plan as a Dagster job, so the UI (Launchpad) and the CLI show the same plan."""

from dagster import (
    AssetKey,
    AssetObservation,
    Config,
    MetadataValue,
    Nothing,
    OpExecutionContext,
    Out,
    Output,
    job,
    op,
)
from pydantic import Field

from backfill_platform.assets import all_assets
from backfill_platform.lineage import Lineage
from backfill_platform.operations.arguments import (
    OPERATOR_ERRORS,
    check_range,
    check_selection,
)
from backfill_platform.operations.plan import build_plan
from backfill_platform.refusals import refusal
from backfill_platform.resources import LakehouseResource, LandingZoneResource

PLAN_MARKER = "preflight_plan"


class PlanConfig(Config):
    select: list[str] = Field(description="Asset keys to backfill, e.g. marts/fct_daily_revenue.")
    start: str = Field(description="First partition key (YYYY-MM-DD), inclusive.")
    end: str = Field(description="Last partition key (YYYY-MM-DD), inclusive.")


@op(out=Out(Nothing), description="Blast radius, inputs, sizes, code versions and conflicts.")
def preflight_plan(
    context: OpExecutionContext,
    config: PlanConfig,
    lakehouse: LakehouseResource,
    landing: LandingZoneResource,
):
    # The code location's asset list itself: the CLI runs this job in process, where no
    # repository (context.repository_def) is bound.
    lineage = Lineage(all_assets)
    try:
        selection = check_selection(lineage, config.select)
        days = check_range(config.start, config.end, confirmed=True)
    except OPERATOR_ERRORS as error:
        raise refusal(f"Refused: {error}") from error
    plan = build_plan(
        lakehouse,
        landing,
        context.instance,
        selection,
        days.first,
        days.last,
        lineage=lineage,
        exclude_run_id=context.run_id,
    )
    if not plan.ok:
        context.log.warning("plan blocked: " + "; ".join(plan.blockers()[:10]))
    for name in plan.selection:
        context.log_event(
            AssetObservation(
                asset_key=AssetKey.from_user_string(name),
                metadata={
                    PLAN_MARKER: MetadataValue.md(plan.markdown()),
                    "plan_ok": plan.ok,
                    "plan_json": MetadataValue.json(plan.to_dict()),
                },
            )
        )
    yield Output(None, metadata={"plan": MetadataValue.md(plan.markdown()), "ok": plan.ok})


@job(
    name="backfill_preflight_plan_job",
    description="Preflight plan of a backfill: launch it with a selection and a range.",
)
def preflight_plan_job():
    preflight_plan()


operations_jobs = [preflight_plan_job]
