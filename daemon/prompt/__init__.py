"""The prompt room: a request's template, tools and thinking planned once into a
:class:`~localllm.daemon.prompt.plan.PromptPlan` (:func:`~localllm.daemon.prompt.plan.plan_prompt`),
from the model's chat template read once (:mod:`.chat`; rendered in a sandbox by
:mod:`.template`), the tools and their grammar (:mod:`.tools`), the reasoning switch
(:mod:`.thinking`) and the conversation as templates read it (:mod:`.history`)."""
