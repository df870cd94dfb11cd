"""Fixed evaluation text shipped with the package: the same tokens for every measurement."""

from __future__ import annotations

# plain English prose, written for llmrun (about 300 Gemma tokens)
ENGLISH = (
    "The river rises in the hills to the north of the town and runs south through farmland for about forty "
    "miles before it reaches the sea. For most of its length it is slow and shallow, and in summer children "
    "swim in the pools below the old stone bridge. The bridge was built in the fourteenth century by the monks "
    "of a nearby abbey, who charged a small toll to every traveller who crossed it. The abbey itself was closed "
    "in the sixteenth century, and its buildings fell into ruin, but the bridge is still in use today. In the "
    "nineteenth century the town grew quickly when a railway line was opened along the valley. Mills were built "
    "on the banks of the river, and workers moved from the countryside to find jobs in them. Rows of brick "
    "houses were built for the workers and their families, and new churches, schools and shops followed. By "
    "the end of the century the population had grown from two thousand to more than fifteen thousand people. "
    "The mills closed one by one in the twentieth century, as cheaper cloth arrived from abroad, and many "
    "families left to look for work in the cities. Today the town is quieter than it was, but visitors come to "
    "walk along the river, to see the ruins of the abbey, and to eat in the restaurants that now fill the old "
    "mill buildings. A small museum near the station tells the story of the mills and the people who worked in "
    "them, and every autumn the town holds a festival with music, food and a market along the main street."
)
