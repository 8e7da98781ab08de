"""The prompt room: a request's template, tools and thinking planned once into a
:class:`~localllm.daemon.prompt.plan.PromptPlan` (:func:`~localllm.daemon.prompt.plan.plan_prompt`),
from the chat template chosen and rendered in a sandbox (:mod:`.template`), the tools and
their grammar (:mod:`.tools`) and the reasoning switch (:mod:`.thinking`)."""
